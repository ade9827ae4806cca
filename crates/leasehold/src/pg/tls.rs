//! TLS for PostgreSQL connections (rustls, ring), set by libpq's URL parameters.
//!
//! | parameter | values | meaning |
//! |---|---|---|
//! | `sslmode` | `disable` | never TLS |
//! | | `prefer` (default) | TLS when the server offers it, plain otherwise; the certificate is not checked |
//! | | `require` | TLS or no connection; the certificate is checked against `sslrootcert` when one is named (as `verify-ca`), not otherwise |
//! | | `verify-ca` | TLS, and the server's certificate must chain to a trusted CA |
//! | | `verify-full` | as `verify-ca`, and the certificate must name the host of the URL (a DNS name or an IP address) |
//! | `sslrootcert` | a PEM file, or `system` | the CAs trusted by `verify-ca` / `verify-full` (and `require`); without it, the system's trust store |
//! | `sslcert`, `sslkey` | PEM files, given together | the client's certificate and key, for a server that asks for one (`hostssl … cert` or `clientcert=verify-*` in `pg_hba.conf`) |
//!
//! As libpq, `prefer` and `require` without a CA protect against eavesdropping, not against a
//! man in the middle: use `verify-full` on a network you do not trust. Channel binding
//! (`SCRAM-SHA-256-PLUS`, `channel_binding=require`) works for certificates signed with RSA or
//! ECDSA over SHA-1/224/256/384/512 (`tls-server-end-point`); with another signature (Ed25519,
//! RSA-PSS) the connection offers none. `sslnegotiation=direct` (PostgreSQL 17's TLS without
//! the `SSLRequest` round trip) is refused. Files are read when the URL is parsed: a missing or
//! unreadable file, or one with no certificate or key in it, fails there with a clear error.

use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS parameters of a URL (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Params {
    mode: Mode,
    root_cert: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
}

impl Params {
    /// Takes `pair` (`name=value` of a URL's query) when it is a TLS parameter; `Ok(false)` when
    /// it is not one.
    pub(crate) fn take(&mut self, pair: &str, shown: &str) -> Result<bool> {
        let Some((name, value)) = pair.split_once('=') else {
            return Ok(false);
        };
        let raw = decode(value);
        let value = String::from_utf8_lossy(&raw).into_owned();
        let path = || {
            if raw.is_empty() {
                Err(bad(shown, format!("{name}: expected a file name")))
            } else {
                // A file name is bytes: one that is not UTF-8 is taken as it is.
                Ok(Some(PathBuf::from(std::ffi::OsString::from_vec(
                    raw.clone(),
                ))))
            }
        };
        match name {
            "sslmode" => {
                self.mode = match value.as_str() {
                    "disable" => Mode::Disable,
                    "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(bad(
                            shown,
                            format!("sslmode {other:?}: expected disable, prefer, require, verify-ca or verify-full"),
                        ))
                    }
                }
            }
            // PostgreSQL 17's direct TLS (ALPN `postgresql`) is not done here.
            "sslnegotiation" if value != "postgres" => {
                return Err(bad(
                    shown,
                    format!("sslnegotiation {value:?}: only postgres (the default) is supported"),
                ))
            }
            "sslrootcert" => self.root_cert = path()?,
            "sslcert" => self.client_cert = path()?,
            "sslkey" => self.client_key = path()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The driver's mode: TLS is attempted unless `disable`, and required from `require` up.
    pub(crate) fn ssl_mode(&self) -> SslMode {
        match self.mode {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }

    /// The connector these parameters make, their files read.
    ///
    /// # Errors
    /// [`Error::Io`] for a file that cannot be read; [`Error::InvalidUrl`] for a file with no
    /// certificate or key in it, `sslcert` without `sslkey` (or the reverse), and a system trust
    /// store with no certificate when one is needed.
    pub(crate) fn connector(&self, shown: &str) -> Result<Connect> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(shown, format!("TLS: {e}")))?;
        let checks_chain = matches!(self.mode, Mode::VerifyCa | Mode::VerifyFull)
            || (self.mode == Mode::Require && self.root_cert.is_some());
        let chain = if checks_chain {
            let roots = Arc::new(self.roots(shown)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| bad(shown, format!("TLS: {e}")))?;
            Some(webpki)
        } else {
            None
        };
        let builder = match chain {
            Some(webpki) if self.mode == Mode::VerifyFull => builder.with_webpki_verifier(webpki),
            chain => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Lenient {
                    chain,
                    algorithms: provider.signature_verification_algorithms,
                })),
        };
        let config = match (&self.client_cert, &self.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let certs = pem_certs(
                    cert,
                    ("client certificate", "read client certificate"),
                    shown,
                )?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    pem_error(e, "read client key", key, shown, "no private key in it")
                })?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| bad(shown, format!("sslcert and sslkey: {e}")))?
            }
            _ => {
                return Err(bad(
                    shown,
                    "sslcert and sslkey go together: name both files or neither".into(),
                ))
            }
        };
        Ok(Connect(Arc::new(config)))
    }

    /// The CAs to trust: `sslrootcert`'s, or the system's.
    fn roots(&self, shown: &str) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(path) if path.as_os_str() != "system" => {
                for cert in pem_certs(path, ("CA file", "read CA file"), shown)? {
                    roots
                        .add(cert)
                        .map_err(|e| bad(shown, format!("sslrootcert {}: {e}", path.display())))?;
                }
            }
            _ => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(bad(
                        shown,
                        "the system's trust store has no certificate: name a CA with sslrootcert"
                            .into(),
                    ));
                }
            }
        }
        Ok(roots)
    }
}

/// `%`-escapes of a URL's query value undone (a file name with spaces, say), as libpq and the
/// driver do: `+` stays a `+`. A `%` not followed by two hex digits stays as it is.
fn decode(value: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(value).collect()
}

fn bad(shown: &str, reason: String) -> Error {
    Error::InvalidUrl {
        url: shown.to_owned(),
        reason,
    }
}

/// The certificates of the PEM file at `path`; at least one.
fn pem_certs(
    path: &std::path::Path,
    (what, op): (&str, &'static str),
    shown: &str,
) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| pem_error(e, op, path, shown, "not PEM"))?;
    if certs.is_empty() {
        return Err(bad(
            shown,
            format!("{what} {}: no certificate in it", path.display()),
        ));
    }
    Ok(certs)
}

/// A PEM reading error: the file's I/O error as such, anything else as a bad file.
fn pem_error(
    e: rustls::pki_types::pem::Error,
    op: &'static str,
    path: &std::path::Path,
    shown: &str,
    none: &str,
) -> Error {
    match e {
        rustls::pki_types::pem::Error::Io(io) => Error::io(op, path.display(), io),
        rustls::pki_types::pem::Error::NoItemsFound => {
            bad(shown, format!("{}: {none}", path.display()))
        }
        other => bad(shown, format!("{}: {other}", path.display())),
    }
}

/// The check of the server's certificate below `verify-full`: for `verify-ca` (and `require`
/// with a CA) the chain's, not the name's; for `prefer` and `require` without a CA, none. Either
/// way the handshake's signatures are checked, so the session is with the holder of the
/// certificate's key.
#[derive(Debug)]
struct Lenient {
    /// The chain's check, if any.
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // WebPKI checks the chain first and the name last: a name error means the chain held.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The driver's TLS connector over rustls.
#[derive(Debug, Clone)]
pub(crate) struct Connect(Arc<ClientConfig>);

/// One connection's TLS handshake, to the host the driver names (none for a Unix socket, over
/// which PostgreSQL offers no TLS).
#[derive(Debug)]
pub(crate) struct Handshake {
    config: Arc<ClientConfig>,
    name: Option<ServerName<'static>>,
}

impl<S> MakeTlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type TlsConnect = Handshake;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<Handshake> {
        Ok(Handshake {
            config: self.0.clone(),
            name: ServerName::try_from(domain.to_owned()).ok(),
        })
    }
}

impl<S> TlsConnect<S> for Handshake
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = Stream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Stream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = self.name.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the host is not a DNS name or an IP address, which TLS needs",
                )
            })?;
            let tls = tokio_rustls::TlsConnector::from(self.config)
                .connect(name, stream)
                .await?;
            Ok(Stream(tls))
        })
    }
}

/// A TLS connection to the server.
#[derive(Debug)]
pub(crate) struct Stream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Stream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Stream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for Stream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let end_point = self
            .0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(|cert| server_end_point(cert));
        match end_point {
            Some(hash) => ChannelBinding::tls_server_end_point(hash),
            None => ChannelBinding::none(),
        }
    }
}

/// RFC 5929's `tls-server-end-point` of a DER certificate: its hash by the hash of its signature
/// algorithm (SHA-256 for MD5 and SHA-1); `None` for an algorithm with no single hash, or a
/// certificate this reader cannot parse.
fn server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest;
    /// A DER element at the start of `der`: its tag, its contents and what follows it.
    fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = der.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (SEQUENCE, certificate, _) = element(cert)? else {
        return None;
    };
    let (SEQUENCE, _, after_tbs) = element(certificate)? else {
        return None;
    };
    let (SEQUENCE, algorithm, _) = element(after_tbs)? else {
        return None;
    };
    let (OID, oid, _) = element(algorithm)? else {
        return None;
    };
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    let hash = match oid {
        o if o == ECDSA_SHA1 => 256,
        [rsa @ .., last] if rsa == RSA => match last {
            0x04 | 0x05 | 0x0b => 256, // MD5, SHA-1, SHA-256
            0x0e => 224,
            0x0c => 384,
            0x0d => 512,
            _ => return None, // RSA-PSS (hash in its parameters) and others
        },
        [ecdsa @ .., last] if ecdsa == ECDSA_SHA2 => match last {
            0x01 => 224,
            0x02 => 256,
            0x03 => 384,
            0x04 => 512,
            _ => return None,
        },
        _ => return None,
    };
    Some(match hash {
        224 => sha2::Sha224::digest(cert).to_vec(),
        256 => sha2::Sha256::digest(cert).to_vec(),
        384 => sha2::Sha384::digest(cert).to_vec(),
        _ => sha2::Sha512::digest(cert).to_vec(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn params(query: &str) -> Result<Params> {
        let mut p = Params::default();
        for pair in query.split('&') {
            assert!(p.take(pair, "postgres://x")?, "{pair} not taken");
        }
        Ok(p)
    }

    #[test]
    fn modes_map_to_the_drivers() {
        assert_eq!(Params::default().ssl_mode(), SslMode::Prefer);
        assert_eq!(
            params("sslmode=disable").unwrap().ssl_mode(),
            SslMode::Disable
        );
        for m in ["require", "verify-ca", "verify-full"] {
            let p = params(&format!("sslmode={m}")).unwrap();
            assert_eq!(p.ssl_mode(), SslMode::Require, "{m}");
        }
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        let e = params("sslmode=allow-everything").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUrl { reason, .. } if reason.contains("verify-full")),
            "{e}"
        );
        let e = params("sslrootcert=").unwrap_err();
        assert!(matches!(&e, Error::InvalidUrl { reason, .. } if reason.contains("sslrootcert")));
        let mut p = Params::default();
        assert!(!p.take("application_name=x", "u").unwrap());
        assert!(!p.take("sslnegotiation=postgres", "u").unwrap());
        let e = p.take("sslnegotiation=direct", "u").unwrap_err();
        assert!(e.to_string().contains("only postgres"), "{e}");
    }

    #[test]
    fn files_named_are_read_when_the_connector_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let p = params(&format!(
            "sslmode=verify-full&sslrootcert={}",
            missing.display()
        ))
        .unwrap();
        let e = p.connector("u").unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let p = params(&format!(
            "sslmode=verify-ca&sslrootcert={}",
            garbage.display()
        ))
        .unwrap();
        let e = p.connector("u").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUrl { reason, .. } if reason.contains("garbage.pem")),
            "{e}"
        );

        let p = params(&format!("sslcert={}", garbage.display())).unwrap();
        let e = p.connector("u").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidUrl { reason, .. } if reason.contains("go together")),
            "{e}"
        );
        // Without a CA, prefer and require need no file.
        params("sslmode=require").unwrap().connector("u").unwrap();
        Params::default().connector("u").unwrap();
    }

    #[test]
    fn a_file_name_may_be_percent_escaped() {
        let p = params("sslrootcert=/tmp/a%20b+c%2Bd%zz%4.pem").unwrap();
        assert_eq!(
            p.root_cert.as_deref(),
            Some(std::path::Path::new("/tmp/a b+c+d%zz%4.pem"))
        );
        let p = params("sslcert=/tmp/%FF.pem").unwrap();
        let name = p.client_cert.unwrap().into_os_string().into_vec();
        assert_eq!(name, b"/tmp/\xff.pem");
    }

    #[test]
    fn end_point_hash_follows_the_signature_algorithm() {
        // A hand-made DER skeleton: SEQUENCE { SEQUENCE {} tbs, SEQUENCE { OID sha256WithRSA } }.
        let der = |oid: &[u8]| {
            let mut alg = vec![0x06, oid.len() as u8];
            alg.extend_from_slice(oid);
            let mut body = vec![0x30, 0x00, 0x30, alg.len() as u8];
            body.extend_from_slice(&alg);
            let mut cert = vec![0x30, body.len() as u8];
            cert.extend_from_slice(&body);
            cert
        };
        let sha256_rsa = der(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b]);
        assert_eq!(server_end_point(&sha256_rsa).map(|h| h.len()), Some(32));
        let sha1_rsa = der(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05]);
        assert_eq!(server_end_point(&sha1_rsa).map(|h| h.len()), Some(32));
        let sha384_ecdsa = der(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03]);
        assert_eq!(server_end_point(&sha384_ecdsa).map(|h| h.len()), Some(48));
        let ed25519 = der(&[0x2b, 0x65, 0x70]);
        assert_eq!(server_end_point(&ed25519), None);
        assert_eq!(server_end_point(&[0x30, 0x85, 0xff]), None);
        assert_eq!(server_end_point(&[]), None);
    }
}
