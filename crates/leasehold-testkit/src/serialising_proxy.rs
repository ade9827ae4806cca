//! The serialising HTTP proxy in front of an emulator: [`leasehold_servers::SerialisingProxy`]
//! (its script is embedded in that crate).

pub use leasehold_servers::SerialisingProxy;
