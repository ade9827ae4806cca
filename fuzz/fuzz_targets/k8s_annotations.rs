#![no_main]
//! `leasehold::fuzzing::k8s_annotations` on the fuzzer's bytes (its docs say what it checks).

libfuzzer_sys::fuzz_target!(|data: &[u8]| leasehold::fuzzing::k8s_annotations(data));
