//! Azure Storage's Shared Key authorization (the Blob service's string to sign), and the
//! credentials and endpoint a connection string or the environment gives.

use crate::error::{Error, Result};
use crate::stores::object::sign::{hmac_sha256, ToSign};
use base64::Engine;
use std::fmt;

/// The development account of Azurite and the older storage emulator, and its published key
/// (not a secret: Microsoft's documentation prints it).
pub const DEV_ACCOUNT: (&str, &str) = (
    "devstoreaccount1",
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
);

/// A storage account's name and key. `Debug` shows the name only.
///
/// ```
/// use leasehold::stores::azure::AzureCredentials;
/// let c = AzureCredentials::new("acct", "c2VjcmV0");
/// assert!(!format!("{c:?}").contains("c2VjcmV0"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct AzureCredentials {
    /// The storage account's name.
    pub account: String,
    /// One of its access keys (base64, as the portal and `az storage account keys list` show it).
    pub key: String,
}

impl AzureCredentials {
    /// Credentials from their parts.
    pub fn new(account: impl Into<String>, key: impl Into<String>) -> Self {
        AzureCredentials {
            account: account.into(),
            key: key.into(),
        }
    }
}

impl fmt::Debug for AzureCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureCredentials")
            .field("account", &self.account)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// What a connection string says.
#[derive(Debug, Default)]
pub(crate) struct Connection {
    pub(crate) credentials: Option<AzureCredentials>,
    pub(crate) endpoint: Option<String>,
}

/// Reads a connection string: `AccountName`, `AccountKey`, `BlobEndpoint`,
/// `DefaultEndpointsProtocol`, `EndpointSuffix`, or `UseDevelopmentStorage=true` (the emulator
/// at `http://127.0.0.1:10000/devstoreaccount1`, or `DevelopmentStorageProxyUri`'s host).
///
/// # Errors
/// [`Error::InvalidOption`] (`AZURE_STORAGE_CONNECTION_STRING`) for a part that is not
/// `Name=value` (the message never shows a value).
pub(crate) fn parse_connection_string(s: &str) -> Result<Connection> {
    let mut parts = std::collections::BTreeMap::new();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(Error::option(
                "AZURE_STORAGE_CONNECTION_STRING",
                "expected Name=value parts separated by ';'",
            ));
        };
        parts.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
    }
    let get = |k: &str| parts.get(k).cloned();
    if get("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        let host = get("developmentstorageproxyuri")
            .map(|u| u.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| "http://127.0.0.1".into());
        return Ok(Connection {
            credentials: Some(AzureCredentials::new(DEV_ACCOUNT.0, DEV_ACCOUNT.1)),
            endpoint: Some(format!("{host}:10000/{}", DEV_ACCOUNT.0)),
        });
    }
    let credentials = match (get("accountname"), get("accountkey")) {
        (Some(a), Some(k)) => Some(AzureCredentials::new(a, k)),
        _ => None,
    };
    let endpoint = get("blobendpoint").or_else(|| {
        let account = get("accountname")?;
        let protocol = get("defaultendpointsprotocol").unwrap_or_else(|| "https".into());
        let suffix = get("endpointsuffix").unwrap_or_else(|| "core.windows.net".into());
        Some(format!("{protocol}://{account}.blob.{suffix}"))
    });
    Ok(Connection {
        credentials,
        endpoint,
    })
}

/// The `Authorization` header's value for `r`.
///
/// # Errors
/// [`Error::InvalidOption`] (`key`) when the account key is not base64.
pub(crate) fn authorization(r: &ToSign, creds: &AzureCredentials) -> Result<String> {
    let header = |name: &str| r.header(name).unwrap_or("");
    let length = match r.body.len() {
        0 => String::new(),
        n => n.to_string(),
    };
    let mut ms: Vec<(String, String)> = r
        .headers
        .iter()
        .filter(|(k, _)| k.starts_with("x-ms-"))
        .map(|(k, v)| (k.clone(), v.trim().to_owned()))
        .collect();
    ms.sort();
    let canonical_headers: String = ms.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let mut query: Vec<(String, String)> = r
        .query
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect();
    query.sort();
    let mut resource = format!("/{}{}", creds.account, r.path);
    for (k, v) in &query {
        resource.push_str(&format!("\n{k}:{v}"));
    }
    let to_sign = format!(
        "{}\n{}\n{}\n{length}\n{}\n{}\n\n{}\n{}\n{}\n{}\n{}\n{canonical_headers}{resource}",
        r.method,
        header("content-encoding"),
        header("content-language"),
        header("content-md5"),
        header("content-type"),
        header("if-modified-since"),
        header("if-match"),
        header("if-none-match"),
        header("if-unmodified-since"),
        header("range"),
    );
    let key = base64::engine::general_purpose::STANDARD
        .decode(creds.key.trim())
        .map_err(|_| Error::option("key", "the storage account key is not base64"))?;
    let signature =
        base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&key, to_sign.as_bytes()));
    Ok(format!("SharedKey {}:{signature}", creds.account))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings() {
        let c = parse_connection_string("UseDevelopmentStorage=true").unwrap();
        assert_eq!(
            c.endpoint.as_deref(),
            Some("http://127.0.0.1:10000/devstoreaccount1")
        );
        assert_eq!(c.credentials.unwrap().account, "devstoreaccount1");
        let c = parse_connection_string(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.windows.net",
        )
        .unwrap();
        assert_eq!(
            c.endpoint.as_deref(),
            Some("https://acct.blob.core.windows.net")
        );
        let c = parse_connection_string(
            "AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;",
        )
        .unwrap();
        assert_eq!(
            c.endpoint.as_deref(),
            Some("http://127.0.0.1:1/devstoreaccount1")
        );
        let err = parse_connection_string("AccountKey")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Name=value"), "{err}");
    }

    #[test]
    fn a_key_that_is_not_base64_is_refused_without_showing_it() {
        let r = ToSign::new(hyper::Method::GET, "/c/b".into());
        let err = authorization(&r, &AzureCredentials::new("a", "not base64!"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not base64") && !err.contains("not base64!"),
            "{err}"
        );
    }
}
