//! The queue suite on PostgreSQL: one server started by the test kit, a fresh database per test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

leasehold_testkit::queue_tests!(leasehold_testkit::servers::shared_postgres().fresh_db());
