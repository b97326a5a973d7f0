//! Replays every input saved in `fuzz/regressions/h1_parse/` through the same steps as the
//! `h1_parse` fuzz target, so a fixed crash stays fixed without running the fuzzer.

use std::path::Path;

#[test]
fn replay_h1_parse_regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/h1_parse");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    assert!(
        !entries.is_empty(),
        "no regression inputs in {}",
        dir.display()
    );
    for path in entries {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        println!("replaying {}", path.display());
        gannet_proto::fuzz_support::h1_parse(&data);
    }
}
