//! Where S3 credentials, region and endpoint come from: the AWS environment variables, then the
//! shared credentials and config files (a named profile), as the AWS CLI and SDKs read them.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// An AWS access key. `Debug` shows the key id only, never the secret or the session token.
///
/// ```
/// use leasehold::stores::s3::AwsCredentials;
/// let c = AwsCredentials::new("AKIDEXAMPLE", "very-secret", Some("token".into()));
/// let shown = format!("{c:?}");
/// assert!(shown.contains("AKIDEXAMPLE") && !shown.contains("very-secret") && !shown.contains("token\""));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    /// The access key id (`AWS_ACCESS_KEY_ID`).
    pub access_key_id: String,
    /// The secret access key (`AWS_SECRET_ACCESS_KEY`).
    pub secret_access_key: String,
    /// The session token of temporary credentials (`AWS_SESSION_TOKEN`).
    pub session_token: Option<String>,
}

impl AwsCredentials {
    /// Credentials from their parts.
    pub fn new(
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
        session_token: Option<String>,
    ) -> Self {
        AwsCredentials {
            access_key_id: access_key_id.into(),
            secret_access_key: secret_access_key.into(),
            session_token,
        }
    }
}

impl fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// An environment variable, if set and not empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The sections of an INI file (`[name]` → key → value), empty when it cannot be read.
fn ini(path: &PathBuf) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return out;
    };
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_owned();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.entry(section.clone())
                .or_default()
                .insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    out
}

fn home_file(var: &str, default: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(default)))
}

/// One profile's settings: the credentials file's `[name]` over the config file's
/// `[profile name]` (`[default]` for the default profile).
fn profile(name: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(config) = home_file("AWS_CONFIG_FILE", ".aws/config") {
        let section = if name == "default" {
            "default".to_owned()
        } else {
            format!("profile {name}")
        };
        if let Some(s) = ini(&config).remove(&section) {
            out.extend(s);
        }
    }
    if let Some(creds) = home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials") {
        if let Some(s) = ini(&creds).remove(name) {
            out.extend(s);
        }
    }
    out
}

/// What the environment and profile say.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) credentials: AwsCredentials,
    pub(crate) region: String,
    pub(crate) endpoint: Option<String>,
}

/// Resolves credentials, region and endpoint: each given value first, then `AWS_ACCESS_KEY_ID`
/// / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`, `AWS_REGION` / `AWS_DEFAULT_REGION`,
/// `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, then the profile (`profile`, else `AWS_PROFILE`,
/// else `default`) in `~/.aws/credentials` and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE`,
/// `AWS_CONFIG_FILE`); the region defaults to `us-east-1`.
///
/// # Errors
/// [`Error::InvalidOption`] (`credentials`) when no access key is found, naming where it was
/// looked for.
pub(crate) fn resolve(
    credentials: Option<AwsCredentials>,
    region: Option<String>,
    endpoint: Option<String>,
    profile_name: Option<&str>,
) -> Result<Resolved> {
    let name = profile_name
        .map(str::to_owned)
        .or_else(|| env("AWS_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let p = profile(&name);
    let from_env = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) if profile_name.is_none() => {
            Some(AwsCredentials::new(id, secret, env("AWS_SESSION_TOKEN")))
        }
        _ => None,
    };
    let from_profile = match (p.get("aws_access_key_id"), p.get("aws_secret_access_key")) {
        (Some(id), Some(secret)) => Some(AwsCredentials::new(
            id.clone(),
            secret.clone(),
            p.get("aws_session_token").cloned(),
        )),
        _ => None,
    };
    let Some(credentials) = credentials.or(from_env).or(from_profile) else {
        return Err(Error::InvalidOption {
            name: "credentials",
            reason: format!(
                "no AWS access key: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or aws_access_key_id and aws_secret_access_key in profile {name:?} of ~/.aws/credentials (AWS_SHARED_CREDENTIALS_FILE) or ~/.aws/config (AWS_CONFIG_FILE)"
            ),
        });
    };
    let region = region
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .or_else(|| p.get("region").cloned())
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint = endpoint
        .or_else(|| env("AWS_ENDPOINT_URL_S3"))
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .or_else(|| p.get("endpoint_url").cloned());
    Ok(Resolved {
        credentials,
        region,
        endpoint,
    })
}
