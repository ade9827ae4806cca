#![no_main]
//! `leasehold::fuzzing::gcs_object` on the fuzzer's bytes (its docs say what it checks).

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold::fuzzing::gcs_object(data));
