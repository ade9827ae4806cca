//! What the object stores share: for all three (`s3`, `azure`, `gcs`) the HTTP transport
//! (`hyper` with rustls, timeouts, body limits, one mapping of refusals to errors), the request
//! to sign and the record size limit; for `s3` and `azure`, also the record's JSON
//! object, object names, conditional requests and their answers, and listing (GCS keeps the
//! single-waiter lock service's JSON and its generations, in its own module).
//!
//! Each S3 and Azure store is a [`RecordStore`](crate::RecordStore) made of the same object logic
//! over a backend of its own (addressing, signing, listing format); the generic adapter
//! ([`crate::adapter::RecordLockStore`]) turns it into a lock store, so the lock algorithm is the
//! one every compare-and-set store shares.
//!
//! - **object**: `PREFIX` + the key's file-safe name (`Naming::file`) + `.json`: one JSON
//!   object per key, the record ([`LeaseRecord`](crate::LeaseRecord)'s JSON form) plus a `write` field with 128
//!   random bits, so that every write changes the object's bytes and therefore its ETag, even a
//!   write that leaves the record as it was;
//! - **writes**: create with `If-None-Match: *`, replace with `If-Match: <ETag read or
//!   written>`, delete with `If-Match: <ETag>`; a precondition that fails (412, 409 for a
//!   create that finds the object, 404 for a replace or delete of an object that is gone) is a
//!   lost race, not an error. Nothing is ever written unconditionally;
//! - **size**: a record whose object would pass [`MAX_RECORD_BYTES`] (labels are the only part
//!   that can grow) is refused before anything is sent ([`Error::InvalidOption`](crate::Error::InvalidOption) naming the
//!   limit); an object above it reads as corrupt;
//! - **fences**: an ETag is a hash, not a counter, so fences are floored at the writer's wall
//!   clock in microseconds, above the previous fence, and above the fence high-water mark once
//!   `cleanup` deleted an object (the adapter's rule for stores without revisions).

pub(crate) mod sign;
pub(crate) mod transport;

#[cfg(any(feature = "s3", feature = "azure"))]
mod floor;
#[cfg(any(feature = "s3", feature = "azure"))]
mod objects;

#[cfg(any(feature = "s3", feature = "azure"))]
pub(crate) use floor::ObjectFloor;
#[cfg(all(feature = "fuzzing", any(feature = "s3", feature = "azure")))]
pub(crate) use objects::decode;
#[cfg(any(feature = "s3", feature = "azure"))]
pub(crate) use objects::{object_record_store, xml_values, Backend, Call, Objects, Page};
#[cfg(any(feature = "s3", feature = "azure"))]
pub use objects::{Precondition, RawAnswer};

/// The largest record object the object stores (S3, Azure, GCS) write or read back: 1 MiB.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// The most bytes of holder id and labels a lease may carry on the object stores
/// ([`crate::RecordStore::label_limit`]): a record holds them and a waiter's id of the same
/// bound, far within [`MAX_RECORD_BYTES`].
pub const LABEL_LIMIT: usize = MAX_RECORD_BYTES / 4;

/// The most of an answer the object stores read when they expect no record in it (a write's, a
/// delete's): a status, headers and a short body.
pub(crate) const SHORT_ANSWER_BYTES: usize = 64 * 1024;

/// The most of one listing page the object stores read.
pub(crate) const LISTING_BYTES: usize = 16 * MAX_RECORD_BYTES;
