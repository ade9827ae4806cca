//! PostgreSQL connections: TLS as libpq's URL parameters set it ([`tls`]), shared by the queue's
//! PostgreSQL backend and the coming PostgreSQL lock store.

pub(crate) mod tls;
