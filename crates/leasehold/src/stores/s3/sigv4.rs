//! AWS Signature Version 4, header form, for S3 requests: the canonical request, the string to
//! sign and the signing key, as AWS documents them (checked against AWS's published examples).

use super::credentials::AwsCredentials;
use crate::stores::object::sign::{hex, hmac_sha256, sha256_hex, uri_encode};

/// A request to sign: its parts as they will be sent.
#[derive(Debug)]
pub(crate) struct ToSign<'a> {
    pub(crate) method: &'a str,
    /// The path as sent (already URI-encoded).
    pub(crate) path: &'a str,
    /// Query parameters, not encoded.
    pub(crate) query: &'a [(&'a str, String)],
    /// Every header to sign, `host` included (names lower case).
    pub(crate) headers: &'a [(String, String)],
    /// The hex SHA-256 of the body (`x-amz-content-sha256`).
    pub(crate) payload_sha256: &'a str,
    /// `YYYYMMDDTHHMMSSZ` (`x-amz-date`).
    pub(crate) amz_date: &'a str,
    pub(crate) region: &'a str,
}

/// The query string as signed and as sent: encoded pairs, sorted.
pub(crate) fn canonical_query(query: &[(&str, String)]) -> String {
    let mut pairs: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| (uri_encode(k, false), uri_encode(v, false)))
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The `Authorization` header's value for `r` signed with `creds` (service `s3`).
pub(crate) fn authorization(r: &ToSign<'_>, creds: &AwsCredentials) -> String {
    let mut headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|(k, v)| {
            let value = v.split_whitespace().collect::<Vec<_>>().join(" ");
            (k.to_ascii_lowercase(), value)
        })
        .collect();
    headers.sort();
    let signed = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let canonical = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed}\n{}",
        r.method,
        r.path,
        canonical_query(r.query),
        r.payload_sha256
    );
    let date = r.amz_date.get(..8).unwrap_or(r.amz_date);
    let scope = format!("{date}/{}/s3/aws4_request", r.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        r.amz_date,
        sha256_hex(canonical.as_bytes())
    );
    let secret = format!("AWS4{}", creds.secret_access_key);
    let k = hmac_sha256(secret.as_bytes(), date.as_bytes());
    let k = hmac_sha256(&k, r.region.as_bytes());
    let k = hmac_sha256(&k, b"s3");
    let k = hmac_sha256(&k, b"aws4_request");
    let signature = hex(&hmac_sha256(&k, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        creds.access_key_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn example_creds() -> AwsCredentials {
        AwsCredentials::new(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            None,
        )
    }

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// AWS's "GET Object" example of header-based Signature Version 4 for S3.
    #[test]
    fn the_get_object_example_of_the_s3_documentation() {
        let headers = h(&[
            ("host", "examplebucket.s3.amazonaws.com"),
            ("range", "bytes=0-9"),
            ("x-amz-content-sha256", EMPTY),
            ("x-amz-date", "20130524T000000Z"),
        ]);
        let auth = authorization(
            &ToSign {
                method: "GET",
                path: "/test.txt",
                query: &[],
                headers: &headers,
                payload_sha256: EMPTY,
                amz_date: "20130524T000000Z",
                region: "us-east-1",
            },
            &example_creds(),
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// AWS's "GET Bucket (List Objects)" example: a signed query string.
    #[test]
    fn the_list_objects_example_of_the_s3_documentation() {
        let headers = h(&[
            ("host", "examplebucket.s3.amazonaws.com"),
            ("x-amz-content-sha256", EMPTY),
            ("x-amz-date", "20130524T000000Z"),
        ]);
        let query = [("max-keys", "2".to_owned()), ("prefix", "J".to_owned())];
        let auth = authorization(
            &ToSign {
                method: "GET",
                path: "/",
                query: &query,
                headers: &headers,
                payload_sha256: EMPTY,
                amz_date: "20130524T000000Z",
                region: "us-east-1",
            },
            &example_creds(),
        );
        assert!(
            auth.ends_with(
                "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
            ),
            "{auth}"
        );
    }
}
