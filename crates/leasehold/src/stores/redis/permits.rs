//! Semaphores and read-write locks ([`AcquireRequest::permit`]): a permit request as a call of
//! the permit acquire script, and the refusal of a request on a key of another kind as the
//! acquire scripts answer it. The rules themselves are in the scripts (`lua/acquire_permit.lua`,
//! and beside the lock's in the others), kept as `decide/permits.rs` states them; the records
//! the client is handed are built from the scripts' answers with the same module's views.

use super::scripts::{Lua, ScriptCall};
use crate::error::Error;
use crate::record::{Permit, PermitKind};
use crate::store::{AcquireRequest, PermitRequest};

/// A call of the permit acquire `script` for `req` asking for `want`, on `record_key` and its
/// fence counter `fence_key`: the key, the permit as it will be held (the script adds its fence
/// and times), the kind and count of key asked for, the waiter lifetime in ms (0: none), and
/// whether the caller waits for change notifications.
pub(super) fn call(
    script: &Lua,
    record_key: String,
    fence_key: String,
    req: &AcquireRequest,
    want: PermitRequest,
) -> ScriptCall {
    let mut permit = Permit {
        holder: req.holder.clone(),
        token: req.token.clone(),
        fence: 0,
        write: want.write(),
        acquired_ms: 0,
        renewed_ms: 0,
        expires_ms: 0,
        ttl_ms: crate::record::ms(req.ttl),
        pid: Some(crate::holder::pid()),
        host: Some(crate::holder::host().to_owned()),
        labels: req.labels.clone(),
    };
    let json = serde_json::to_vec(&permit).unwrap_or_else(|_| {
        // Strings and string maps always serialise; should that ever fail, without labels.
        permit.labels.clear();
        serde_json::to_vec(&permit).unwrap_or_default()
    });
    let (kind, permits) = match want {
        PermitRequest::Semaphore { permits } => ("semaphore", permits),
        PermitRequest::Read | PermitRequest::Write => ("read-write", 0),
    };
    let waiter_ms = req.waiter_ttl.map_or(0, |d| crate::record::ms(d).max(1));
    let bytes = record_key.len() + fence_key.len() + req.key.as_str().len() + json.len() + 48;
    let mut call = script.prepare(2, 6, bytes);
    call.arg(record_key)
        .arg(fence_key)
        .arg(req.key.as_str())
        .arg(json)
        .arg(kind)
        .arg(permits)
        .arg(waiter_ms)
        .arg(u8::from(req.watching));
    call
}

/// The refusal of `req` on a key that is of `kind` (`lock`, `semaphore` of `permits`,
/// `read-write`), as the acquire scripts name it; `None` for a kind they never name.
pub(super) fn refusal(req: &AcquireRequest, kind: &str, permits: u32) -> Option<Error> {
    let is = match kind {
        "lock" => "a lock".to_owned(),
        "semaphore" => PermitKind::Semaphore { permits }.to_string(),
        "read-write" => PermitKind::ReadWrite.to_string(),
        _ => return None,
    };
    Some(crate::decide::mismatch(
        req.key.as_str(),
        &is,
        &crate::decide::asked(req),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;
    use std::time::Duration;

    /// The refusal names what the key is and what it was asked for as, like the other stores'.
    #[test]
    fn refusals_name_both_kinds() {
        let mut req = AcquireRequest::new(Key::new("slots").unwrap(), "a", Duration::from_secs(1));
        req.permit = Some(PermitRequest::Read);
        let e = refusal(&req, "semaphore", 3).unwrap();
        let text = e.to_string();
        assert!(matches!(
            e,
            Error::InvalidOption {
                name: "permits",
                ..
            }
        ));
        assert!(text.contains("slots is a semaphore of 3 permits"), "{text}");
        assert!(text.contains("asked for as a read-write lock"), "{text}");
        req.permit = None;
        let text = refusal(&req, "read-write", 0).unwrap().to_string();
        assert!(
            text.contains("is a read-write lock") && text.contains("as a lock"),
            "{text}"
        );
        assert!(
            refusal(&req, "queue", 0).is_none(),
            "a kind no script names"
        );
    }
}
