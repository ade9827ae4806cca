//! The header is usable as documented: `tests/c/smoke.c`, compiled with the system's C compiler
//! against the static library of this build, runs against a real Redis.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

/// The system libraries a program linking `libleasehold.a` needs (as `rustc --print
/// native-static-libs` lists them; docs/src/c.md says the same).
const SYSTEM_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

/// How long the program may run before the test fails (it takes well under a second).
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// `libleasehold.a` of this build: cargo builds the library (every crate type) into the
/// directory of the test executables, without a hash in its name.
fn static_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let deps = exe
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent", exe.display()));
    let lib = deps.join("libleasehold.a");
    assert!(
        lib.is_file(),
        "{} is missing: cargo builds it with this test",
        lib.display()
    );
    lib
}

fn compile(out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let compiled = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/smoke.c"))
        .arg(static_library())
        .args(SYSTEM_LIBS)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(
        compiled.status.success(),
        "{cc} failed ({}):\n{}",
        compiled.status,
        String::from_utf8_lossy(&compiled.stderr)
    );
}

/// Runs `cmd`, failing the test if it is not done within [`RUN_LIMIT`] (then killed).
fn run(cmd: &mut Command) -> Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the program: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(RUN_LIMIT) {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!("waiting for the program: {e}"),
        Err(_) => {
            let pid = i32::try_from(pid).unwrap_or(i32::MAX);
            // SAFETY: signals our own child, by its PID.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the program did not finish within {RUN_LIMIT:?}");
        }
    }
}

#[test]
fn a_c_program_locks_waits_cancels_and_watches_events_on_redis() {
    let redis = leasehold_testkit::servers::shared_redis();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let exe = dir.path().join("smoke");
    compile(&exe);
    let prefix = leasehold_testkit::prefix("c/");
    let output = run(Command::new(&exe).arg(redis.url()).arg(&prefix));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success() && stdout.trim() == "ok",
        "smoke.c failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
}
