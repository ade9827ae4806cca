//! etcd errors as [`Error`]s that say whether a retry can help, and calls bounded in time.

use crate::error::{Error, Result};
use std::future::Future;
use std::time::Duration;

/// `e` (from a call to the store described as `store`) as an [`Error`]: an unreachable member,
/// a lost quorum or a call out of time is [`Error::Unavailable`] (retryable); refused credentials
/// or permissions, and a request etcd refuses as too large, are [`Error::Store`] that no retry
/// heals, saying which.
pub(crate) fn map_err(store: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    use tonic::Code;
    let (detail, retryable) = match &e {
        E::GRpcStatus(s) => match s.code() {
            Code::Unauthenticated => (
                format!(
                    "authentication failed (user or password refused, or the token expired): {}",
                    s.message()
                ),
                false,
            ),
            Code::PermissionDenied => (
                format!(
                    "permission denied (the user's role lacks read/write on the prefix): {}",
                    s.message()
                ),
                false,
            ),
            Code::InvalidArgument | Code::ResourceExhausted | Code::FailedPrecondition => {
                (format!("request refused: {}", s.message()), false)
            }
            Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled => {
                return Error::unavailable(
                    store,
                    format!(
                        "no member answered ({}: {}); is a quorum of members up?",
                        code_name(s.code()),
                        s.message()
                    ),
                )
                .caused_by(e)
            }
            c => (format!("{}: {}", code_name(c), s.message()), true),
        },
        E::TransportError(t) => {
            return Error::unavailable(store, format!("cannot connect: {t}")).caused_by(e)
        }
        E::IoError(io) => return Error::unavailable(store, format!("I/O: {io}")).caused_by(e),
        E::InvalidArgs(a) => (format!("invalid arguments: {a}"), false),
        E::InvalidUri(u) => (format!("invalid member address: {u}"), false),
        other => (other.to_string(), true),
    };
    Error::Store {
        store: store.to_owned(),
        detail,
        retryable,
        source: None,
    }
    .caused_by(e)
}

fn code_name(c: tonic::Code) -> String {
    format!("{c:?}")
}

/// `call` with a time limit: [`Error::no_answer`] when it runs out, else its result mapped.
pub(crate) async fn bounded<T>(
    store: &str,
    limit: Duration,
    call: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map_err(|e| map_err(store, e)),
        Err(_) => Err(Error::no_answer(store)),
    }
}

/// Whether `e` says the request never reached a member (the connection to the one the channel
/// picked could not be made), so that sending it again cannot do it twice.
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable
                && (s.message().contains("connect error")
                    || s.message().contains("Connection refused"))
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// The call `f` makes, bounded by `limit` in all, sent again at once when it never reached a
/// member (the client's channel spreads calls over the members, and one that is down refuses
/// the connection): a dead member costs a retry, not a failed call.
pub(crate) async fn retried<T, Fut>(
    store: &str,
    limit: Duration,
    mut f: impl FnMut() -> Fut,
) -> Result<T>
where
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, f()).await {
            Err(_) => return Err(Error::no_answer(store)),
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e))
                if not_sent(&e)
                    && tokio::time::Instant::now() + Duration::from_millis(20) < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(Err(e)) => return Err(map_err(store, e)),
        }
    }
}
