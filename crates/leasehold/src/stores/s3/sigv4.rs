//! AWS Signature Version 4, header form, for S3 requests: the canonical request, the string to
//! sign and the signing key, as AWS documents them (checked against AWS's published examples).

use super::credentials::AwsCredentials;
use crate::stores::object::sign::{hex, hmac_sha256, sha256_hex, ToSign};

/// The `Authorization` header's value for `r` signed with `creds` for `region` (service `s3`):
/// its time and payload hash are its `x-amz-date` and `x-amz-content-sha256` headers.
pub(crate) fn authorization(r: &ToSign, creds: &AwsCredentials, region: &str) -> String {
    let amz_date = r.header("x-amz-date").unwrap_or("");
    let payload_sha256 = r.header("x-amz-content-sha256").unwrap_or("");
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
        r.query_string(),
        payload_sha256
    );
    let date = amz_date.get(..8).unwrap_or(amz_date);
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let secret = format!("AWS4{}", creds.secret_access_key);
    let k = hmac_sha256(secret.as_bytes(), date.as_bytes());
    let k = hmac_sha256(&k, region.as_bytes());
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
    use hyper::Method;

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
        let mut r = ToSign::new(Method::GET, "/test.txt".into());
        r.headers = headers;
        let auth = authorization(&r, &example_creds(), "us-east-1");
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
        let mut r = ToSign::new(Method::GET, "/".into());
        r.query = vec![("prefix", "J".to_owned()), ("max-keys", "2".to_owned())];
        r.headers = headers;
        let auth = authorization(&r, &example_creds(), "us-east-1");
        assert!(
            auth.ends_with(
                "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
            ),
            "{auth}"
        );
    }
}
