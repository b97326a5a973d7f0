//! Variables the configuration defines: `set $name value`, the computed ones (`map`, `geo`,
//! `split_clients`) and named regex captures `(?<name>...)` in `location`, `if`, `rewrite`
//! and `map` regexes.
//!
//! Load time: every module compiles its own templates through `Template::compile`, so the
//! table of names lives in a registry scoped to one config load ([`LoadScope`]) rather than
//! in every setter's signature. A name gets its index the first time it is read or defined;
//! a name that is read somewhere but never defined anywhere is nginx's
//! `unknown "name" variable`, reported at the first directive that reads it ([`check`]).
//!
//! Run time: a request keeps one slot per variable, grown on the first write, so a request
//! that never meets a user variable allocates nothing. A computed variable is evaluated when
//! first read and cached for the request (unless it is `volatile`), as in nginx.

use crate::errlog::Level;
use crate::http::regex::{Captures, Regex};
use crate::http::request::Request;
use crate::http::variables::{Sent, Var};
use gannet_conf::{ConfError, Loc};
use std::cell::RefCell;
use std::sync::Arc;

/// A reference to a user variable, as compiled into a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserVar {
    pub idx: u32,
    pub name: Arc<str>,
}

/// A variable whose value a block directive computes from the request (`map`, `geo`,
/// `split_clients`).
pub trait Computed: Send + Sync + std::fmt::Debug {
    fn value(&self, req: &Request, sent: Option<&Sent>) -> String;
    /// Evaluated again at every read instead of once per request.
    fn volatile(&self) -> bool {
        false
    }
}

/// The variables of one loaded config that need more than a slot: the computed ones, by
/// index.
#[derive(Debug, Default)]
pub struct VarTable {
    computed: Vec<Option<Arc<dyn Computed>>>,
    /// Built-in variables of a prefix (`$http_NAME`, `$arg_NAME`...) that `set` or
    /// `auth_request_set` assign somewhere: a value assigned in the request is read instead
    /// of the built-in one (nginx's weak variables). Empty in most configs, and then the
    /// only cost to a read is looking at its length.
    /// Filled by [`finish`] once the servers are read (the table is made before them).
    weak: std::sync::OnceLock<Vec<(Var, u32)>>,
}

impl VarTable {
    /// Whether some `set` may give `var` (a prefixed built-in) a value of its own.
    pub fn may_assign(&self, var: &Var) -> bool {
        self.weak
            .get()
            .is_some_and(|w| w.iter().any(|(v, _)| v == var))
    }

    /// The value assigned to `var` in this request, if `var` is one a config assigns.
    pub fn append_assigned(&self, var: &Var, req: &Request, out: &mut String) -> bool {
        let Some(weak) = self.weak.get().filter(|w| !w.is_empty()) else {
            return false;
        };
        weak.iter()
            .find(|(v, _)| v == var)
            .is_some_and(|(_, idx)| req.vars.append(*idx, out).is_ok())
    }
}

struct Entry {
    name: Arc<str>,
    defined: bool,
    /// Where it was first read, for the unknown-variable error.
    first_use: Option<Loc>,
    computed: Option<Arc<dyn Computed>>,
    /// A built-in variable of a prefix this one's assignments stand in for.
    weak: Option<Var>,
}

#[derive(Default)]
struct Registry {
    vars: Vec<Entry>,
    /// The directive being loaded.
    at: Option<Loc>,
}

thread_local! {
    static LOADING: RefCell<Option<Registry>> = const { RefCell::new(None) };
}

/// The registry for one config load; dropped (even on an error) when the load ends.
pub struct LoadScope(());

impl LoadScope {
    pub fn begin() -> LoadScope {
        LOADING.with(|l| *l.borrow_mut() = Some(Registry::default()));
        LoadScope(())
    }
}

impl Drop for LoadScope {
    fn drop(&mut self) {
        LOADING.with(|l| *l.borrow_mut() = None);
    }
}

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> Option<T> {
    LOADING.with(|l| l.borrow_mut().as_mut().map(f))
}

/// The directive whose templates are compiled next (for the unknown-variable error).
pub fn at(loc: &Loc) {
    with_registry(|r| r.at = Some(loc.clone()));
}

impl Registry {
    fn index(&mut self, name: &str) -> usize {
        match self.vars.iter().position(|e| &*e.name == name) {
            Some(i) => i,
            None => {
                self.vars.push(Entry {
                    name: Arc::from(name),
                    defined: false,
                    first_use: None,
                    computed: None,
                    weak: None,
                });
                self.vars.len() - 1
            }
        }
    }

    fn var(&self, i: usize) -> UserVar {
        UserVar {
            idx: i as u32,
            name: self.vars[i].name.clone(),
        }
    }
}

/// A read of `$name` that is not a built-in variable: a user variable while a config is
/// loading, else nothing (the caller reports it as unknown).
pub(crate) fn reference(name: &str) -> Option<UserVar> {
    with_registry(|r| {
        let i = r.index(name);
        if r.vars[i].first_use.is_none() {
            r.vars[i].first_use = r.at.clone();
        }
        r.var(i)
    })
}

/// Define `$name` (by `set`, a computed variable or a named capture). Built-in variables cannot be
/// redefined, as nginx's `the duplicate "uri" variable`.
pub fn define(name: &str) -> Result<UserVar, String> {
    if Var::from_name(name).is_some() {
        return Err(format!("the duplicate \"{name}\" variable"));
    }
    define_slot(name, None)
}

/// Define `$name` for an assignment (`set`, `auth_request_set`): as [`define`], except
/// that a built-in variable of a prefix (`$http_foo`) may be assigned, as nginx allows:
/// where the request assigned it, reads find the assigned value, elsewhere the built-in one.
pub fn define_assigned(name: &str) -> Result<UserVar, String> {
    match Var::from_name(name) {
        Some(v) if v.is_prefixed() => define_slot(name, Some(v)),
        _ => define(name),
    }
}

fn define_slot(name: &str, weak: Option<Var>) -> Result<UserVar, String> {
    if name.is_empty() {
        return Err("invalid variable name \"$\"".to_string());
    }
    with_registry(|r| {
        let i = r.index(name);
        r.vars[i].defined = true;
        if weak.is_some() {
            r.vars[i].weak = weak;
        }
        r.var(i)
    })
    .ok_or_else(|| format!("\"${name}\" cannot be defined outside a config load"))
}

/// Define `$name` as computed by `c` (a later definition of the same name replaces it).
pub fn define_computed(name: &str, c: Arc<dyn Computed>) -> Result<UserVar, String> {
    let v = define(name)?;
    with_registry(|r| r.vars[v.idx as usize].computed = Some(c));
    Ok(v)
}

/// The computed variables defined so far, for the servers loaded next (they are all
/// http-level blocks, read first).
pub fn table() -> Arc<VarTable> {
    let computed = with_registry(|r| r.vars.iter().map(|e| e.computed.clone()).collect());
    Arc::new(VarTable {
        computed: computed.unwrap_or_default(),
        weak: Default::default(),
    })
}

/// Once every server is read: note in `table` the built-in variables the config assigns.
pub fn finish(table: &VarTable) {
    let weak = with_registry(|r| {
        r.vars
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((e.weak.clone()?, i as u32)))
            .collect()
    });
    let _ = table.weak.set(weak.unwrap_or_default());
}

/// At the end of a load: every variable read somewhere must be defined somewhere.
pub fn check() -> Result<(), ConfError> {
    let missing = with_registry(|r| {
        r.vars
            .iter()
            .find(|e| !e.defined)
            .map(|e| (e.name.clone(), e.first_use.clone()))
    })
    .flatten();
    match missing {
        None => Ok(()),
        Some((name, loc)) => {
            let msg = format!("unknown \"{name}\" variable");
            Err(match loc {
                Some(l) => ConfError::at(&l, msg),
                None => ConfError::bare(msg),
            })
        }
    }
}

/// A regex whose named captures set user variables when it matches (nginx's behaviour for
/// `location`, `if`, `rewrite` and `map` regexes).
#[derive(Debug, Clone)]
pub struct CapRegex {
    pub re: Regex,
    /// (capture group index, variable)
    named: Vec<(usize, UserVar)>,
}

impl CapRegex {
    /// Compile `pattern`; its named groups become defined variables.
    pub fn compile(pattern: &str, caseless: bool) -> Result<CapRegex, String> {
        let re = Regex::new(pattern, caseless)?;
        let mut named = Vec::new();
        for (i, name) in re.names() {
            named.push((i, define(name)?));
        }
        Ok(CapRegex { re, named })
    }

    /// Match `subject`: on a match, the named captures are stored in `req`'s variables and
    /// the numbered ones returned (`$0`..).
    pub fn captures(&self, subject: &str, req: &Request) -> Option<Vec<Option<String>>> {
        let caps = self.re.captures(subject.as_bytes())?;
        Some(self.bind(&caps, req))
    }

    /// Store the named captures of a match already collected as `$0`.. (a location's).
    pub fn bind_collected(&self, caps: &[Option<String>], req: &Request) {
        for (i, var) in &self.named {
            let v = caps.get(*i).cloned().flatten().unwrap_or_default();
            req.vars.set(var.idx, v);
        }
    }

    /// Store a match's named captures in `req`'s variables; return the numbered ones.
    pub fn bind(&self, caps: &Captures, req: &Request) -> Vec<Option<String>> {
        for (i, var) in &self.named {
            req.vars.set(var.idx, caps.text(*i).into_owned());
        }
        caps.to_strings()
    }
}

#[derive(Debug, Clone, Default)]
enum Slot {
    #[default]
    Unset,
    Value(String),
    /// A computed variable being evaluated: reading it again is a cycle.
    Busy,
}

/// One request's user variable values.
#[derive(Debug, Default)]
pub struct Values(RefCell<Vec<Slot>>);

/// What reading a slot found, when it had no value to append.
enum Missing {
    Unset,
    Busy,
}

impl Values {
    /// Take `other`'s values: a subrequest and its main request see one set of variables,
    /// as nginx's share one array (`sr->variables = r->variables`).
    pub fn copy_from(&self, other: &Values) {
        self.0.borrow_mut().clone_from(&other.0.borrow());
    }

    pub fn set(&self, idx: u32, value: String) {
        self.put(idx, Slot::Value(value));
    }

    fn put(&self, idx: u32, slot: Slot) {
        let mut v = self.0.borrow_mut();
        let i = idx as usize;
        if v.len() <= i {
            v.resize(i + 1, Slot::Unset);
        }
        v[i] = slot;
    }

    /// Append the slot's value, if it has one.
    fn append(&self, idx: u32, out: &mut String) -> Result<(), Missing> {
        match self.0.borrow().get(idx as usize) {
            Some(Slot::Value(v)) => {
                out.push_str(v);
                Ok(())
            }
            Some(Slot::Busy) => Err(Missing::Busy),
            Some(Slot::Unset) | None => Err(Missing::Unset),
        }
    }
}

/// The value `set` gave `var` in this request, if any (no computation, no warning): for a
/// variable a module reads but that is nobody's to define but the config's (`$uid_reset`).
pub fn value(var: &UserVar, req: &Request) -> Option<String> {
    let mut out = String::new();
    req.vars.append(var.idx, &mut out).ok().map(|()| out)
}

/// Append the value of `var` for `req`: its slot, else its computation (run now), else
/// nothing, with nginx's warning.
pub fn append(out: &mut String, var: &UserVar, req: &Request, sent: Option<&Sent>) {
    match req.vars.append(var.idx, out) {
        Ok(()) => {}
        Err(Missing::Busy) => crate::errlog::request(
            Level::Error,
            req,
            format_args!("cycle while evaluating variable \"{}\"", var.name),
        ),
        Err(Missing::Unset) => {
            let computed = req
                .server
                .vars
                .computed
                .get(var.idx as usize)
                .cloned()
                .flatten();
            let Some(c) = computed else {
                crate::errlog::request(
                    Level::Warn,
                    req,
                    format_args!("using uninitialized \"{}\" variable", var.name),
                );
                return;
            };
            req.vars.put(var.idx, Slot::Busy);
            let v = c.value(req, sent);
            out.push_str(&v);
            let slot = if c.volatile() {
                Slot::Unset
            } else {
                Slot::Value(v)
            };
            req.vars.put(var.idx, slot);
        }
    }
}
