//! The bodies of the fuzz targets (`fuzz/fuzz_targets/`) and of the property tests that run the
//! same bodies on stable Rust (`crates/leasehold/tests/fuzz_bodies.rs`).
//!
//! Each takes arbitrary bytes, feeds them to the parsers of one area of what leasehold reads from
//! outside, and panics only when a property fails: a parser that panics, an error that is not a
//! typed [`Error`], two keys sharing a store name, a store name outside its store's alphabet, a
//! record that does not read back as written, a lease whose holder the store's truth names read
//! as free. Not an API: behind the `fuzzing` feature, hidden from the docs.

#![allow(clippy::panic, missing_docs)]

use crate::error::Error;
use crate::key::{Key, Naming};
use crate::record::LeaseRecord;
use crate::url::LONGEST_DURATION as LONGEST_URL_DURATION;

/// Reads typed values off the front of fuzz input; past its end, zeros and empty strings.
#[cfg(any(feature = "kubernetes", feature = "queue"))]
struct Input<'a>(&'a [u8]);

#[cfg(any(feature = "kubernetes", feature = "queue"))]
impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }

    fn i64(&mut self) -> i64 {
        // One byte picks a number near the edges, or eight bytes make any.
        match self.byte() % 4 {
            0 => i64::from(self.byte()),
            1 => -i64::from(self.byte()),
            2 => [i64::MAX, i64::MIN, 0, -1][usize::from(self.byte() % 4)],
            _ => {
                let mut b = [0u8; 8];
                for x in &mut b {
                    *x = self.byte();
                }
                i64::from_le_bytes(b)
            }
        }
    }

    /// A string of up to 255 bytes (lossy UTF-8).
    fn text(&mut self) -> String {
        let n = usize::from(self.byte()).min(self.0.len());
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        String::from_utf8_lossy(s).into_owned()
    }

    /// One of `known`, or (one time in four) any string.
    fn one_of(&mut self, known: &[&str]) -> String {
        let b = usize::from(self.byte());
        match known.get(b % (known.len() + known.len().div_ceil(3))) {
            Some(k) => (*k).to_owned(),
            None => self.text(),
        }
    }

    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        (self.byte() % 2 == 1).then(|| f(self))
    }
}

/// Checks an error of a parser of outside input: typed as one of `allowed`, with a message.
fn typed(e: &Error, what: &str) {
    assert!(
        matches!(
            e,
            Error::InvalidUrl { .. }
                | Error::InvalidOption { .. }
                | Error::InvalidKey { .. }
                | Error::FeatureNotEnabled { .. }
        ),
        "{what}: an untyped error {e:?}"
    );
    assert!(!e.to_string().is_empty(), "{what}: an empty message");
}

/// Keys from bytes, and their names in every store that maps keys to names: the file store's
/// and object stores' file names, Kubernetes' DNS-1123 names, GCS object names. Input: two
/// keys separated by a `0xFF` byte (never part of UTF-8).
pub fn key(data: &[u8]) {
    let mut parts = data.splitn(2, |b| *b == 0xFF);
    let a = parts.next().unwrap_or_default();
    let b = parts.next().unwrap_or_default();
    let keys: Vec<Option<Key>> = [a, b]
        .iter()
        .map(|bytes| match Key::from_bytes(bytes) {
            Ok(k) => {
                assert_eq!(k.as_str().as_bytes(), *bytes, "a key is its bytes");
                Some(k)
            }
            Err(e) => {
                typed(&e, "Key::from_bytes");
                None
            }
        })
        .collect();
    let [Some(ka), Some(kb)] = &keys[..] else {
        return;
    };
    let same = ka == kb;
    let file = Naming::file();
    let (na, nb) = (file.name(ka), file.name(kb));
    for n in [&na, &nb] {
        assert!(!n.is_empty() && n.len() <= 200 + 2 + 32, "file name {n:?}");
        assert!(!n.starts_with('.'), "file name {n:?}");
        assert!(
            n.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c)),
            "file name {n:?}"
        );
    }
    assert_eq!(same, na == nb, "file names {na:?} / {nb:?}");
    for prefix in ["", "lh-", "task-llm-"] {
        let dns = Naming::dns1123(prefix);
        let (na, nb) = (dns.name(ka), dns.name(kb));
        for n in [&na, &nb] {
            assert!(!n.is_empty() && n.len() <= 63, "DNS-1123 name {n:?}");
            assert!(
                n.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
                "DNS-1123 name {n:?}"
            );
            assert!(
                !n.starts_with('-') && !n.ends_with('-'),
                "DNS-1123 name {n:?}"
            );
        }
        assert_eq!(same, na == nb, "DNS-1123 names {na:?} / {nb:?}");
    }
    #[cfg(feature = "gcs")]
    for prefix in ["", "locks/", "a/b/"] {
        let gcs = |k: &Key| crate::stores::gcs::object_name(prefix, k);
        let (na, nb) = (gcs(ka), gcs(kb));
        for n in [&na, &nb] {
            let rest = &n[prefix.len()..];
            assert!(n.starts_with(prefix) && n.len() <= 1024, "GCS name {n:?}");
            assert!(!matches!(rest, "" | "." | ".."), "GCS name {n:?}");
        }
        assert_eq!(same, na == nb, "GCS names {na:?} / {nb:?}");
    }
    // Redis Cluster: a key is its record's and counter's hash tag (`PREFIX{key}`), so both land
    // in one slot, which the grant's script needs; a key that cannot be a tag is refused.
    #[cfg(feature = "redis-cluster")]
    for k in [ka, kb] {
        use crate::stores::redis::cluster::{check_key, slot};
        match check_key(k) {
            Ok(()) => {
                let (record, counter) = (format!("lh:lock:{{{k}}}"), format!("lh:fence:{{{k}}}"));
                assert_eq!(slot(&record), slot(&counter), "{record} / {counter}");
            }
            Err(e) => typed(&e, "check_key"),
        }
    }
}

/// Records as JSON (the file, memory, Redis, etcd and object stores' format, and Kubernetes'
/// labels): any bytes read as a record or an error; a record read writes back as itself; the
/// fence salvaged from damaged bytes never panics. And the S3 and Azure listings' XML: any text
/// reads as names, an escaped name reads back as itself.
pub fn record_json(data: &[u8]) {
    let _ = crate::decide::salvage_fence(data);
    #[cfg(any(feature = "s3", feature = "azure"))]
    {
        use crate::stores::object::xml_values;
        let text = String::from_utf8_lossy(data);
        let _ = xml_values(&text, "Key");
        let escaped = text
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;");
        let listing = format!("<R><Key>{escaped}</Key><Key>x</Key></R>");
        assert_eq!(
            xml_values(&listing, "Key"),
            [text.as_ref(), "x"],
            "{listing}"
        );
    }
    let Ok(r) = serde_json::from_slice::<LeaseRecord>(data) else {
        return;
    };
    let json = serde_json::to_vec(&r).unwrap_or_default();
    match serde_json::from_slice::<LeaseRecord>(&json) {
        Ok(back) => assert_eq!(back, r, "{}", String::from_utf8_lossy(&json)),
        Err(e) => panic!("a record read does not read back: {e}"),
    }
    #[cfg(any(feature = "s3", feature = "azure"))]
    match crate::stores::object::decode(data, String::new()) {
        crate::store::Stored::Record { record, .. } => assert_eq!(record, r),
        crate::store::Stored::Corrupt { .. } => panic!("the object stores refuse a record"),
    }
}

/// Kubernetes Lease objects: the spec (holder, renew and acquire times, duration) and any
/// annotations. A Lease whose spec names a holder reads as held by that holder, whatever the
/// annotations say; one without reads as free or corrupt. Input: the spec's fields, then
/// `name=value` annotation lines (`leasehold.io/` is added to names without a `/`).
#[cfg(feature = "kubernetes")]
pub fn k8s_annotations(data: &[u8]) {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::chrono::DateTime;
    let mut input = Input(data);
    let time = |i: &mut Input<'_>| {
        let ms = i.i64();
        DateTime::from_timestamp_millis(ms).map(MicroTime)
    };
    let spec = LeaseSpec {
        holder_identity: input.opt(|i| i.one_of(&["web-1", ""])),
        renew_time: input.opt(time).flatten(),
        acquire_time: input.opt(time).flatten(),
        lease_duration_seconds: input.opt(|i| i.i64() as i32),
        ..LeaseSpec::default()
    };
    let text = String::from_utf8_lossy(input.0);
    let annotations = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let k = if k.contains('/') {
                k.to_owned()
            } else {
                format!("leasehold.io/{k}")
            };
            (k, v.to_owned())
        })
        .collect();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("lh-k".into()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(spec.clone()),
    };
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    match (crate::stores::kubernetes::stored(&lease), holder) {
        (crate::store::Stored::Record { record, .. }, Some(h)) => {
            assert_eq!(record.holder.as_deref(), Some(h.as_str()), "{lease:?}");
            assert!(record.token.is_some(), "{lease:?}");
        }
        (crate::store::Stored::Corrupt { .. }, Some(_)) => {
            panic!("damaged annotations freed a held Lease: {lease:?}")
        }
        (crate::store::Stored::Record { record, .. }, None) => {
            assert!(
                record.token.is_none() && record.holder.is_none(),
                "{lease:?}"
            );
        }
        (crate::store::Stored::Corrupt { detail, .. }, None) => assert!(!detail.is_empty()),
    }
}

/// Google Cloud Storage objects (the single-waiter lock service's JSON, with leasehold's record in it):
/// any bytes read as a record or a damaged object; the service's `ownerId` is the holder; a record
/// read, written back over the object, reads back with the same holder and fence.
#[cfg(feature = "gcs")]
pub fn gcs_object(data: &[u8]) {
    use crate::stores::gcs::object::{decode, encode, parse};
    use serde_json::Value;
    let Ok(map) = parse(data) else { return };
    let Ok(r) = decode(&map, "k", 60_000) else {
        return;
    };
    match map.get("ownerId") {
        Some(Value::String(h)) if !h.is_empty() => {
            assert_eq!(r.holder.as_deref(), Some(h.as_str()));
            assert!(r.token.is_some());
        }
        _ => assert!(r.token.is_none() && r.holder.is_none(), "{r:?}"),
    }
    let written = encode(&r, Some(map), 0);
    match decode(&written, "k", 60_000) {
        Ok(back) => {
            assert_eq!(back.holder, r.holder, "{written:?}");
            assert_eq!(back.token.is_some(), r.token.is_some(), "{written:?}");
            assert_eq!(back.fence, r.fence, "{written:?}");
        }
        Err(e) => panic!("an object written reads as damaged: {e:?} {written:?}"),
    }
}

/// Store URLs, every scheme: parsed as opening the store would, without connecting. Ok or a
/// typed error; every duration given is at most 100 years; a Redis store's record
/// and counter prefixes never start one with the other (so no record key is a counter key); an
/// etcd store's prefix is not empty. Input: the URL (lossy UTF-8).
pub fn url(data: &[u8]) {
    let url = String::from_utf8_lossy(data);
    let url = url.as_ref();
    // A URL shown in messages and logs carries no password.
    let redacted = crate::url::redact(url);
    if let Ok(r) = url::Url::parse(&redacted) {
        let p = r.password().unwrap_or("***");
        assert_eq!(p, "***", "{url:?} redacted as {redacted:?}");
        for (k, v) in r.query_pairs() {
            if matches!(k.as_ref(), "pass" | "password" | "sentinel_pass") {
                assert_eq!(v, "***", "{url:?} redacted as {redacted:?}");
            }
        }
    }
    let Some(result) = crate::stores::check(url) else {
        return;
    };
    let result = result.map(|durations| {
        for d in durations {
            assert!(d <= LONGEST_URL_DURATION, "{url:?}: {d:?}");
        }
    });
    if let Err(e) = result {
        typed(&e, url);
    }
}

/// Durations, as URL parameters give them (`?timeout=`, `?max_clock_skew=`), and record times
/// (RFC 3339 or milliseconds). Input: the text (lossy UTF-8).
pub fn duration(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();
    match crate::url::duration(text) {
        Ok(d) => assert!(d <= LONGEST_URL_DURATION, "{text:?}: {d:?}"),
        Err(e) => assert!(!e.is_empty()),
    }
    if !text.contains(['&', '#']) {
        let url = format!("record-memory://?max_clock_skew={text}");
        let mut params = crate::url::Params::of_url(&url);
        match params.take_max_clock_skew() {
            Ok(skew) => {
                assert!(params.finish().is_ok(), "{url:?}");
                assert!(skew <= LONGEST_URL_DURATION, "{text:?}: {skew:?}");
            }
            Err(e) => typed(&e, &url),
        }
    }
    if let Ok(ms) = crate::record::parse_ms(text) {
        let written = crate::record::format_ms(ms);
        assert_eq!(
            crate::record::parse_ms(&written),
            Ok(ms),
            "{text:?} → {written}"
        );
    }
}

/// The queue's task rows, as the SQLite and PostgreSQL backends read them: any columns read as a
/// task or as a corrupt row with a reason; a task read has a valid key and the row's id.
#[cfg(feature = "queue")]
pub fn queue_row(data: &[u8]) {
    use crate::queue::row::RawTask;
    use crate::queue::TaskEntry;
    let mut i = Input(data);
    let raw = RawTask {
        id: i.i64(),
        key: i.one_of(&["job", "a/b", ""]),
        grp: i.opt(Input::text),
        priority: i.one_of(&["high", "normal", "low", " HIGH "]),
        rank: i.i64(),
        payload: i.text(),
        state: i.one_of(&["pending", "running", "succeeded", "failed", "cancelled"]),
        policy: i.one_of(&["at-most-once", "at-least-once"]),
        max_attempts: i.i64(),
        attempts: i.i64(),
        timeout_ms: i.opt(Input::i64),
        enqueued_ms: i.i64(),
        started_ms: i.opt(Input::i64),
        ended_ms: i.opt(Input::i64),
        worker: i.opt(Input::text),
        fence: i.opt(Input::i64),
        lease_expires_ms: i.opt(Input::i64),
        cancel: i.i64(),
        detail: i.opt(Input::text),
    };
    let (id, key) = (raw.id, raw.key.clone());
    match raw.parse() {
        TaskEntry::Task(t) => {
            assert_eq!(i64::try_from(t.id), Ok(id));
            assert!(Key::new(&t.key).is_ok() && t.key == key, "{t:?}");
        }
        TaskEntry::Corrupt { corrupt, .. } => assert!(!corrupt.is_empty()),
    }
}
