//! PostgreSQL connections, shared by the queue's PostgreSQL backend and the PostgreSQL lock
//! store: TLS as libpq's URL parameters set it ([`tls`]), connecting, listening, bounds and
//! errors ([`conn`]), and a shared connection made again when it ends ([`link`]).

pub(crate) mod conn;
pub(crate) mod link;
pub(crate) mod tls;
