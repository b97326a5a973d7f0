//! Replays every input kept in fuzz/regressions/conf_parse/ (seeds and past crashes of the
//! `conf_parse` fuzz target) through `parse_str`: each must return, Ok or Err.

use std::path::Path;

#[test]
fn replay_conf_parse_regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/conf_parse");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    assert!(!entries.is_empty(), "no inputs in {}", dir.display());
    for path in &entries {
        let data = std::fs::read(path).unwrap();
        let src = String::from_utf8_lossy(&data);
        // Same call as the fuzz target; a panic here names the file.
        eprintln!("replaying {}", path.display());
        let _ = gannet_conf::parse_str(
            &src,
            "fuzz.conf",
            Path::new("/nonexistent-gannet-fuzz-base"),
        );
    }
}
