#![no_main]
//! `leasehold::fuzzing::duration` on the fuzzer's bytes (its docs say what it checks).

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold::fuzzing::duration(data));
