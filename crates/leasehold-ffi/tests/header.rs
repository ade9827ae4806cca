//! The checked-in header (`include/leasehold.h`) is what cbindgen makes of the sources today.

use std::path::Path;

#[test]
fn the_checked_in_header_is_generated_from_the_sources() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("cbindgen.toml: {e}"));
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen cannot generate the header: {e}"));
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = crate_dir.join("include/leasehold.h");
    let checked_in = std::fs::read(&path).unwrap_or_default();
    if generated == checked_in {
        return;
    }
    if std::env::var_os("LEASEHOLD_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    panic!(
        "{} is not what cbindgen makes of the sources: regenerate it with\n\n    \
         LEASEHOLD_BLESS=1 cargo test -p leasehold-ffi --test header\n\nand commit it",
        path.display()
    );
}
