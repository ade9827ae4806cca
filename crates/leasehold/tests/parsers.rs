//! Property tests of what leasehold reads from outside: keys (from strings and bytes), their store
//! names, and lease records. Whatever the input: no panic, a typed error, and two keys never share
//! a name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::{Error, Key, LeaseRecord, Naming};
use proptest::prelude::*;

/// Keys that exercise the names: characters a name may keep and ones it must escape.
fn key_text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9/._ -]{1,70}|.{1,300}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn any_string_is_a_key_or_an_invalid_key_error(s in ".{0,600}") {
        match Key::new(&s) {
            Ok(k) => prop_assert_eq!(k.as_str(), s.as_str()),
            Err(e) => prop_assert!(matches!(e, Error::InvalidKey { .. }), "{e:?}"),
        }
    }

    #[test]
    fn any_bytes_are_a_key_or_an_invalid_key_error(b in proptest::collection::vec(any::<u8>(), 0..600)) {
        match Key::from_bytes(&b) {
            Ok(k) => prop_assert_eq!(k.as_str().as_bytes(), b.as_slice()),
            Err(e) => prop_assert!(matches!(e, Error::InvalidKey { .. }), "{e:?}"),
        }
    }

    #[test]
    fn file_names_are_safe_and_never_shared(a in key_text(), b in key_text()) {
        let n = Naming::file();
        if let (Ok(ka), Ok(kb)) = (Key::new(&a), Key::new(&b)) {
            let (na, nb) = (n.name(&ka), n.name(&kb));
            for name in [&na, &nb] {
                prop_assert!(!name.is_empty() && name.len() <= 200 + 2 + 32, "{name}");
                prop_assert!(!name.starts_with('.'), "{name}");
                prop_assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)), "{name}");
            }
            prop_assert_eq!(a == b, na == nb, "{} / {}", na, nb);
        }
    }

    #[test]
    fn kubernetes_names_are_dns1123_and_never_shared(a in key_text(), b in key_text()) {
        let n = Naming::dns1123("lh-");
        if let (Ok(ka), Ok(kb)) = (Key::new(&a), Key::new(&b)) {
            let (na, nb) = (n.name(&ka), n.name(&kb));
            for name in [&na, &nb] {
                prop_assert!(name.len() <= 63, "{name}");
                prop_assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
                prop_assert!(!name.ends_with('-'), "{name}");
            }
            prop_assert_eq!(a == b, na == nb, "{} / {}", na, nb);
        }
    }

    #[test]
    fn any_bytes_read_as_a_record_or_an_error(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = serde_json::from_slice::<LeaseRecord>(&b);
    }

    #[test]
    fn records_round_trip(
        key in ".{1,50}", holder in ".{0,50}", fence in any::<u64>(),
        label in ".{0,50}", value in ".{0,200}", expires in any::<u64>(),
    ) {
        let mut r = LeaseRecord::free(&key, fence);
        r.holder = Some(holder);
        r.token = Some("t".into());
        r.expires_ms = expires;
        r.labels.insert(label, value);
        let back: LeaseRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        prop_assert_eq!(back, r);
    }
}
