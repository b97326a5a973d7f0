//! The one regex engine of the server: PCRE2, the library nginx links, so that every regex
//! an nginx config holds (`location ~`, `server_name ~`, `rewrite`, `if`, `map`,
//! `proxy_redirect`, `proxy_cookie_*`, `fastcgi_split_path_info`, `gzip_disable` ...) means
//! what it means in nginx: lookarounds, backreferences, atomic groups, possessive
//! quantifiers, `\Q..\E`, `(?<name>)` / `(?P<name>)` / `(?'name')` names.
//!
//! Compiled as nginx compiles: no UTF mode (a subject is bytes, as a decoded URI may hold
//! any byte; `.` is one byte and `~*` folds ASCII letters only), only `PCRE2_CASELESS` as
//! an option, and the compile errors worded as nginx words them. Unlike nginx (whose
//! `pcre_jit` is off unless set), every pattern is JIT-compiled when the library can: it is
//! what makes a location-heavy config cost about what the `regex` crate cost.
//!
//! Matching reuses its scratch memory: a plain test goes through the crate's per-regex pool,
//! a match with captures borrows a match block from this regex's own small pool, so a
//! request allocates nothing to match (nginx keeps one match block per process).

use crate::errlog::{self, Level};
use pcre2::bytes::{CaptureLocations, RegexBuilder};
use std::borrow::Cow;
use std::sync::Mutex;

/// A compiled pattern.
pub struct Regex {
    re: pcre2::bytes::Regex,
    /// Match blocks for matches with captures, returned after each use.
    spare: Mutex<Vec<CaptureLocations>>,
}

/// A match that PCRE2 could not finish (its match or JIT stack limit hit by a pattern
/// that backtracks too much); logged where it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchFailed;

impl Regex {
    /// Compile `pattern` as nginx does, `caseless` for `~*`. The error is nginx's text,
    /// e.g. `pcre2_compile() failed: missing closing parenthesis in "("`.
    pub fn new(pattern: &str, caseless: bool) -> Result<Regex, String> {
        let re = RegexBuilder::new()
            .caseless(caseless)
            .jit_if_available(true)
            .build(pattern)
            .map_err(|e| compile_error(pattern, &e))?;
        Ok(Regex {
            re,
            spare: Mutex::new(Vec::new()),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        self.re.as_str()
    }

    /// The number of groups, counting the whole match (`$0`) as one.
    pub fn groups(&self) -> usize {
        self.re.captures_len()
    }

    /// The named groups: (index, name).
    pub fn names(&self) -> impl Iterator<Item = (usize, &str)> {
        self.re
            .capture_names()
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_deref().map(|n| (i, n)))
    }

    /// Whether `subject` matches, without collecting captures.
    pub fn matches(&self, subject: &[u8]) -> Result<bool, MatchFailed> {
        self.re
            .is_match(subject)
            .map_err(|e| self.failed(subject, &e))
    }

    /// Whether `subject` matches; a failed match (already logged) counts as none.
    pub fn is_match(&self, subject: &[u8]) -> bool {
        self.matches(subject).unwrap_or(false)
    }

    /// Match `subject` and keep where its groups are.
    pub fn captures_checked<'r, 's>(
        &'r self,
        subject: &'s [u8],
    ) -> Result<Option<Captures<'r, 's>>, MatchFailed> {
        let mut locs = self
            .spare
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop()
            .unwrap_or_else(|| self.re.capture_locations());
        match self.re.captures_read(&mut locs, subject) {
            Ok(Some(_)) => Ok(Some(Captures {
                re: self,
                subject,
                locs: Some(locs),
            })),
            Ok(None) => {
                self.give_back(locs);
                Ok(None)
            }
            Err(e) => {
                self.give_back(locs);
                Err(self.failed(subject, &e))
            }
        }
    }

    /// As [`Regex::captures_checked`]; a failed match (already logged) counts as none.
    pub fn captures<'r, 's>(&'r self, subject: &'s [u8]) -> Option<Captures<'r, 's>> {
        self.captures_checked(subject).ok().flatten()
    }

    fn give_back(&self, locs: CaptureLocations) {
        let mut spare = self
            .spare
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // One per worker that matched at once is all that is ever needed; the bound keeps
        // a burst from growing the pool for good.
        if spare.len() < 8 {
            spare.push(locs);
        }
    }

    /// nginx's alert for a match that failed (it answers 500 where the router does too).
    fn failed(&self, subject: &[u8], e: &pcre2::Error) -> MatchFailed {
        errlog::log(
            Level::Alert,
            format_args!(
                "pcre2_match() failed: {} on \"{}\" using \"{}\"",
                e.code(),
                String::from_utf8_lossy(subject),
                self.as_str()
            ),
        );
        MatchFailed
    }
}

impl Clone for Regex {
    fn clone(&self) -> Regex {
        Regex {
            re: self.re.clone(),
            spare: Mutex::new(Vec::new()),
        }
    }
}

impl std::fmt::Debug for Regex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Regex({:?})", self.as_str())
    }
}

/// nginx's wording of a compile error: the library's message, the pattern, and the rest
/// of the pattern from where the error was found unless that is its end.
fn compile_error(pattern: &str, e: &pcre2::Error) -> String {
    // The crate words it "PCRE2: error compiling pattern at offset N: MESSAGE".
    let display = e.to_string();
    let msg = display.splitn(3, ": ").nth(2).unwrap_or(&display);
    let rest = e
        .offset()
        .and_then(|at| pattern.as_bytes().get(at..))
        .filter(|rest| !rest.is_empty());
    match rest {
        Some(rest) => format!(
            "pcre2_compile() failed: {msg} in \"{pattern}\" at \"{}\"",
            String::from_utf8_lossy(rest)
        ),
        None => format!("pcre2_compile() failed: {msg} in \"{pattern}\""),
    }
}

/// Where a match's groups are in its subject; its match block goes back to the regex's
/// pool when dropped.
pub struct Captures<'r, 's> {
    re: &'r Regex,
    subject: &'s [u8],
    locs: Option<CaptureLocations>,
}

impl<'s> Captures<'_, 's> {
    /// The number of groups, the whole match included.
    pub fn groups(&self) -> usize {
        self.locs.as_ref().map_or(0, |l| l.len())
    }

    /// Where group `i` is, if it took part in the match.
    pub fn range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        self.locs.as_ref()?.get(i).map(|(s, e)| s..e)
    }

    /// Group `i`'s bytes.
    pub fn get(&self, i: usize) -> Option<&'s [u8]> {
        self.range(i).and_then(|r| self.subject.get(r))
    }

    /// Group `i` as text ("" if it did not take part). A group may end inside a UTF-8
    /// sequence (PCRE2 matches bytes): such bytes become U+FFFD rather than a panic.
    pub fn text(&self, i: usize) -> Cow<'s, str> {
        String::from_utf8_lossy(self.get(i).unwrap_or_default())
    }

    /// Every group as a template's `$0`..`$9` (None for a group that did not take part).
    pub fn to_strings(&self) -> Vec<Option<String>> {
        (0..self.groups())
            .map(|i| self.get(i).map(|b| String::from_utf8_lossy(b).into_owned()))
            .collect()
    }
}

impl Drop for Captures<'_, '_> {
    fn drop(&mut self) {
        if let Some(locs) = self.locs.take() {
            self.re.give_back(locs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcre_only_constructs_compile_and_match() {
        let re = Regex::new(r"/\.(?!well-known)", false).unwrap();
        assert!(re.is_match(b"/.git/config"));
        assert!(!re.is_match(b"/.well-known/acme"));
        assert!(Regex::new(r"^/(\w)\1$", false).unwrap().is_match(b"/aa"));
        assert!(!Regex::new(r"^a++b?a$", false).unwrap().is_match(b"aaa"));
        assert!(Regex::new(r"^(?>a+)b$", false).unwrap().is_match(b"aab"));
        assert!(Regex::new(r"^\Q/a.b\E$", false).unwrap().is_match(b"/a.b"));
        assert!(!Regex::new(r"^\Q/a.b\E$", false).unwrap().is_match(b"/axb"));
    }

    #[test]
    fn caseless_folds_ascii_only_and_bytes_never_fail() {
        let re = Regex::new("^/ABC", true).unwrap();
        assert!(re.is_match(b"/abc"));
        // Not UTF-8, and `.` is one byte: no error, no panic.
        let re = Regex::new("^/(.)(.)$", false).unwrap();
        let caps = re.captures(b"/\xc3\xa9").unwrap();
        assert_eq!(caps.get(1), Some(&b"\xc3"[..]));
        assert_eq!(caps.text(2), "\u{fffd}");
        assert!(Regex::new("x", false).unwrap().is_match(b"\xff\xfex"));
    }

    #[test]
    fn named_groups_in_every_spelling() {
        let re = Regex::new(r"(?<a>x)(?P<b>y)(?'c'z)(w)", false).unwrap();
        let names: Vec<_> = re.names().collect();
        assert_eq!(names, [(1, "a"), (2, "b"), (3, "c")]);
        assert_eq!(re.groups(), 5);
        let caps = re.captures(b"xyzw").unwrap();
        assert_eq!(caps.to_strings()[4].as_deref(), Some("w"));
    }

    #[test]
    fn errors_are_worded_as_nginx() {
        assert_eq!(
            Regex::new("(", false).unwrap_err(),
            "pcre2_compile() failed: missing closing parenthesis in \"(\""
        );
        assert_eq!(
            Regex::new("[z-a]", false).unwrap_err(),
            "pcre2_compile() failed: range out of order in character class in \"[z-a]\" at \"a]\""
        );
    }

    #[test]
    fn match_blocks_are_reused() {
        let re = Regex::new("(a)", false).unwrap();
        for _ in 0..3 {
            assert!(re.captures(b"a").is_some());
        }
        assert_eq!(re.spare.lock().unwrap().len(), 1);
    }
}
