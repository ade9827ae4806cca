//! Test certificates made with `openssl`: a fresh CA per server (or deployment), a server
//! certificate for 127.0.0.1 and `localhost`, and client certificates.

use crate::error::{Error, Result};
use crate::process::server_dir;
use std::path::Path;
use std::process::Command;

/// The extensions of a client certificate.
pub const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n";

/// Runs `openssl args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| {
            Error::Missing(format!(
                "cannot run openssl ({e}): install it (apt-get install openssl)"
            ))
        })?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// A key and a certificate for `subject` (`name.key`, `name.crt` in `dir`), signed by the CA
/// of `dir` (`ca.crt`, `ca.key`), X.509 v3 with the extensions in `ext` (rustls takes no v1
/// certificate).
///
/// # Errors
/// When openssl is missing or fails.
pub fn sign_cert(dir: &Path, name: &str, subject: &str, ext: &str) -> Result<()> {
    let ext_file = format!("{name}.ext");
    std::fs::write(dir.join(&ext_file), ext).map_err(Error::io(format!("write {ext_file}")))?;
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ],
    )
}

/// A fresh CA with a server certificate for 127.0.0.1 and `localhost` and a client certificate,
/// in a new temp dir: `ca.crt`, `server.crt`/`server.key`, `client.crt`/`client.key`. (A CA no
/// server trusts, for tests of a certificate that must be refused.)
///
/// # Errors
/// When openssl is missing or fails.
pub fn test_certs() -> Result<tempfile::TempDir> {
    let dir = server_dir("certs")?;
    make_certs(dir.path())?;
    Ok(dir)
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate in `dir` (`ca.crt`,
/// `server.crt`, `server.key`, `client.crt`, `client.key`).
pub(crate) fn make_certs(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=leasehold test CA",
        ],
    )?;
    sign_cert(
        dir,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )?;
    // For servers that ask clients for a certificate.
    sign_cert(dir, "client", "/CN=leasehold test client", CLIENT_EXT)
}
