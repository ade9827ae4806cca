//! The fuzz targets' bodies (`leasehold::fuzzing`, run for long by `cargo +nightly fuzz run …`,
//! see CONTRIBUTING.md), run on stable as property tests: arbitrary bytes, and inputs shaped like
//! what the parsers read (valid URLs mutated, annotation maps, objects in the GCS lock service's JSON, task rows).
//! A failing body panics with the property it broke.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::fuzzing;
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Text made of the pieces URLs are made of, so that mutations reach past the first check.
fn url_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9._-]{0,12}",
        Just("%".into()),
        Just("%2F".into()),
        Just("%ff".into()),
        Just("@".into()),
        Just(":".into()),
        Just(",".into()),
        Just("/".into()),
        Just("?".into()),
        Just("&".into()),
        Just("=".into()),
        Just("[::1]".into()),
        Just("99999999999999999999".into()),
        Just("0".into()),
        Just("1s".into()),
        Just("500000000000y".into()),
        Just("18446744073709551615ms".into()),
        Just("timeout=".into()),
        Just("max_clock_skew=".into()),
        Just("prefix=".into()),
        Just("fence_prefix=".into()),
        Just("replicas=".into()),
        Just("replicas_timeout=".into()),
        Just("endpoint=http://127.0.0.1:1".into()),
        Just("sslmode=".into()),
        Just("mode=".into()),
        Just("é".into()),
        ".{0,4}",
    ]
}

/// A valid URL of every scheme, which the strategies below mutate.
const VALID: &[&str] = &[
    "file:///tmp/leasehold-fuzz-never-created?mode=0640&fsync=true",
    "memory://",
    "record-memory://?max_clock_skew=5s",
    "redis://u:secret@127.0.0.1:1/0?prefix=p:lock:&timeout=2s&replicas=1&replicas_timeout=500ms",
    "rediss://127.0.0.1:1/0",
    "redis+unix:///run/r.sock?db=2&user=u&pass=secret",
    "redis+sentinel://u:secret@127.0.0.1:1,127.0.0.1:2/mymaster/0?sentinel_pass=x",
    "redis+cluster://127.0.0.1:1,127.0.0.1:2?prefix=p:lock:",
    "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0?timeout=200ms",
    "k8s://default?prefix=lh-&timeout=2s&max_clock_skew=1m",
    "gs://bucket/locks?endpoint=http://127.0.0.1:1&timeout=3s",
    "s3://bucket/locks?endpoint=http://127.0.0.1:1&region=us-east-1&timeout=3s",
    "az://container/locks?account=devstoreaccount1&endpoint=http://127.0.0.1:1",
    "postgres://u:secret@127.0.0.1:1/db?schema=s&table=t&timeout=2s&sslmode=disable",
    "etcd://u:secret@127.0.0.1:1,127.0.0.1:2?prefix=lh/&timeout=2s",
];

/// A valid URL with a piece inserted, replaced or appended as a parameter.
fn mutated_url() -> impl Strategy<Value = String> {
    (
        0..VALID.len(),
        any::<prop::sample::Index>(),
        0..4u8,
        url_piece(),
        url_piece(),
    )
        .prop_map(|(which, at, how, a, b)| {
            let base = VALID[which];
            let mut cut = at.index(base.len() + 1);
            while !base.is_char_boundary(cut) {
                cut -= 1;
            }
            let sep = if base.contains('?') { '&' } else { '?' };
            match how {
                0 => format!("{}{a}{}", &base[..cut], &base[cut..]),
                1 => format!("{}{a}", &base[..cut]),
                2 => format!("{base}{sep}{a}{b}"),
                _ => format!("{base}{sep}{a}={b}"),
            }
        })
}

/// Inputs the fuzz targets found, kept.
#[test]
fn fuzz_findings() {
    // A path whose escaping equals the password's is no password shown.
    fuzzing::url(b"g://.:\xa4\xc7@\x0c/.:.%gm\r.://.G\0\xd2\xd5\xd0\xd9:y");
    // A secret parameter's name percent-encoded is still a secret parameter.
    fuzzing::url(b"redis+unix:///run/r.sock?pa%73s=secret&db=2");
    fuzzing::url(b"redis+sentinel://h:1/m?sentinel%5Fpass=secret");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn key_names_from_any_bytes(b in bytes(300)) {
        fuzzing::key(&b);
    }

    #[test]
    fn key_names_of_two_similar_keys(a in "[a-zA-Z0-9/._ -]{1,40}|.{1,300}", b in "[a-zA-Z0-9/._ -]{1,40}") {
        let mut input = a.clone().into_bytes();
        input.push(0xFF);
        input.extend_from_slice(format!("{a}{b}").as_bytes());
        fuzzing::key(&input);
        let mut same = a.clone().into_bytes();
        same.push(0xFF);
        same.extend_from_slice(a.as_bytes());
        fuzzing::key(&same);
    }

    #[test]
    fn durations_from_any_text(s in ".{0,40}|[0-9]{1,25}[a-z]{0,6}( [0-9]{1,5}[a-z]{1,3}){0,3}") {
        fuzzing::duration(s.as_bytes());
    }

    #[test]
    fn record_times_read_back(ms in any::<u64>()) {
        fuzzing::duration(leasehold::format_ms(ms).as_bytes());
    }

    #[test]
    fn records_from_any_bytes(b in bytes(400)) {
        fuzzing::record_json(&b);
    }

    #[test]
    fn records_from_json_shaped_text(
        fence in prop_oneof![Just("7".to_string()), Just("-1".into()), Just("1e3".into()), Just("18446744073709551616".into()), Just("\"7\"".into())],
        time in prop_oneof![Just("null".to_string()), Just("0".into()), Just("\"2026-11-26T08:00:00.123Z\"".into()), Just("\"9999-12-31T23:59:59.999Z\"".into()), Just("\"253402300800000\"".into()), Just("\"1969-12-31T23:59:59Z\"".into()), Just("18446744073709551615".into()), Just("\"x\"".into())],
        holder in prop_oneof![Just("null".to_string()), Just("\"web-1\"".into()), Just("\"\"".into()), Just("7".into())],
        extra in prop_oneof![Just(String::new()), Just(r#","labels":{"a":"b"}"#.to_string()), Just(r#","labels":[]"#.into()), Just(r#","pid":4294967296"#.into()), Just(r#","waiter_expires":"2026-11-26T08:00:00Z","waiter_token":"t""#.into())],
    ) {
        let json = format!(
            r#"{{"key":"k","holder":{holder},"token":"t","fence":{fence},"acquired":{time},"renewed":{time},"expires":{time},"ttl_ms":1000{extra}}}"#
        );
        fuzzing::record_json(json.as_bytes());
    }

    #[test]
    fn urls_from_any_text(s in ".{0,120}") {
        fuzzing::url(s.as_bytes());
    }

    #[test]
    fn urls_mutated_from_valid_ones(s in mutated_url()) {
        fuzzing::url(s.as_bytes());
    }
}

#[cfg(feature = "kubernetes")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn k8s_leases_from_any_bytes(b in bytes(300)) {
        fuzzing::k8s_annotations(&b);
    }

    #[test]
    fn k8s_leases_with_annotations_of_ours(
        spec in bytes(40),
        lines in proptest::collection::vec(
            (
                prop_oneof![Just("key"), Just("fence"), Just("token"), Just("holder"), Just("renewed"), Just("expires"), Just("ttl-ms"), Just("waiter"), Just("waiter-token"), Just("waiter-expires"), Just("waiter-ttl-ms"), Just("pid"), Just("host"), Just("labels"), Just("store")],
                prop_oneof![Just("k".to_string()), Just("7".into()), Just("-1".into()), Just("18446744073709551616".into()), Just("2026-11-26T08:00:00.123Z".into()), Just("web-1".into()), Just("{}".into()), Just("{\"a\":1}".into()), Just(String::new()), ".{0,12}"],
            ),
            0..10,
        ),
    ) {
        // The spec's fields are read off the front of the input: 40 bytes cover them.
        let mut input = spec;
        input.push(b'\n');
        for (k, v) in lines {
            input.extend_from_slice(format!("{k}={v}\n").as_bytes());
        }
        fuzzing::k8s_annotations(&input);
    }
}

#[cfg(feature = "gcs")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn gcs_objects_from_any_bytes(b in bytes(300)) {
        fuzzing::gcs_object(&b);
    }

    #[test]
    fn gcs_objects_in_the_lock_services_json(
        owner in prop_oneof![Just("null".to_string()), Just("\"web-1\"".into()), Just("\"\"".into()), Just("7".into())],
        expires in prop_oneof![Just("0".to_string()), Just("1790000030.5".into()), Just("-1".into()), Just("1e300".into()), Just("null".into()), Just("\"soon\"".into()), Just("18446744073709551.615".into())],
        waiter in prop_oneof![Just("null".to_string()), Just("\"web-2\"".into()), Just("[]".into())],
        ours in prop_oneof![
            Just(String::new()),
            Just(r#","leasehold":{"key":"k","holder":"web-1","token":"t","fence":9,"acquired":null,"renewed":null,"expires":1790000030500,"ttl_ms":1000}"#.to_string()),
            Just(r#","leasehold":{"fence":12}"#.into()),
            Just(r#","leasehold":"x""#.into()),
        ],
    ) {
        let json = format!(
            r#"{{"ownerId":{owner},"expiresAt":{expires},"waitingOwnerId":{waiter},"waiterExpiresAt":{expires}{ours}}}"#
        );
        fuzzing::gcs_object(json.as_bytes());
    }
}

#[cfg(feature = "queue")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn queue_rows_from_any_bytes(b in bytes(200)) {
        fuzzing::queue_row(&b);
    }
}
