//! The SSI commands (`include`, `echo`, `set`, `config`, `if` / `elif` / `else` /
//! `endif`, `block` / `endblock`), their parameters' variables and `if` expressions, and
//! `$date_local` / `$date_gmt`.

use super::*;

impl Stream {
    pub(super) fn log(&self, args: std::fmt::Arguments) {
        errlog::error(args);
    }

    /// Run the command just parsed; an include is handed back to be run.
    pub(super) fn run(&mut self, req: &Request, out: &mut Vec<u8>) -> Option<Include> {
        let cmd = std::mem::take(&mut self.command);
        let params = std::mem::take(&mut self.params);
        let r = self.command_with(req, &cmd, &params, out);
        self.command = cmd;
        match r {
            Ok(inc) => inc,
            Err(Failed) => {
                self.error(out);
                None
            }
        }
    }

    pub(super) fn command_with(
        &mut self,
        req: &Request,
        cmd: &[u8],
        params: &[(Vec<u8>, Vec<u8>)],
        out: &mut Vec<u8>,
    ) -> Result<Option<Include>, Failed> {
        // (name, its parameters: (name, mandatory, multiple), conditional level, block)
        let spec: (&[(&str, bool)], u8, bool) = match cmd {
            b"include" => (
                &[
                    ("virtual", false),
                    ("file", false),
                    ("wait", false),
                    ("set", false),
                    ("stub", false),
                ],
                0,
                false,
            ),
            b"echo" => (
                &[("var", true), ("default", false), ("encoding", false)],
                0,
                false,
            ),
            b"config" => (&[("errmsg", false), ("timefmt", false)], 0, false),
            b"set" => (&[("var", true), ("value", true)], 0, false),
            b"if" => (&[("expr", true)], 0, false),
            b"elif" => (&[("expr", true)], 1, false),
            b"else" => (&[], 1, false),
            b"endif" => (&[], 2, false),
            b"block" => (&[("name", true)], 0, false),
            b"endblock" => (&[], 0, true),
            _ => {
                if self.output {
                    self.log(format_args!("invalid SSI command: \"{}\"", lossy(cmd)));
                    return Err(Failed);
                }
                return Ok(None);
            }
        };
        let (names, conditional, block) = spec;
        if !self.output && !block {
            if self.block {
                // Inside a block: the command is kept as text, rebuilt.
                let mut t = b"<!--#".to_vec();
                t.extend_from_slice(cmd);
                for (k, v) in params {
                    t.push(b' ');
                    t.extend_from_slice(k);
                    t.extend_from_slice(b"=\"");
                    t.extend_from_slice(v);
                    t.push(b'"');
                }
                t.extend_from_slice(b" -->");
                if let Some(b) = self.shared.borrow_mut().blocks.last_mut() {
                    b.1.extend_from_slice(&t);
                }
                return Ok(None);
            }
            if conditional == 0 {
                return Ok(None);
            }
        }
        let c = lossy(cmd);
        if conditional != 0 && (self.conditional == 0 || self.conditional > conditional) {
            self.log(format_args!("invalid context of SSI command: \"{c}\""));
            return Err(Failed);
        }
        if params.len() > MAX_PARAMS {
            self.log(format_args!("too many SSI command parameters: \"{c}\""));
            return Err(Failed);
        }
        let mut got: Vec<Option<Vec<u8>>> = vec![None; names.len()];
        for (k, v) in params {
            let Some(i) = names.iter().position(|(n, _)| n.as_bytes() == k.as_slice()) else {
                self.log(format_args!(
                    "invalid parameter name: \"{}\" in \"{c}\" SSI command",
                    lossy(k)
                ));
                return Err(Failed);
            };
            if got[i].is_some() {
                self.log(format_args!(
                    "duplicate \"{}\" parameter in \"{c}\" SSI command",
                    lossy(k)
                ));
                return Err(Failed);
            }
            got[i] = Some(v.clone());
        }
        for (i, (n, mandatory)) in names.iter().enumerate() {
            if *mandatory && got[i].is_none() {
                self.log(format_args!(
                    "mandatory \"{n}\" parameter is absent in \"{c}\" SSI command"
                ));
                return Err(Failed);
            }
        }
        let mut got = got.into_iter();
        let mut p = move || got.next().flatten();
        match cmd {
            b"include" => self.include(req, p(), p(), p(), p(), p()).map(Some),
            b"echo" => self.echo(req, p(), p(), p(), out).map(|()| None),
            b"config" => {
                let (errmsg, timefmt) = (p(), p());
                if let Some(t) = timefmt {
                    self.timefmt = t;
                }
                if let Some(e) = errmsg {
                    self.errmsg = e;
                }
                Ok(None)
            }
            b"set" => {
                let (name, value) = (p().unwrap_or_default(), p().unwrap_or_default());
                let value = self.evaluate(req, &value, false)?;
                let name = String::from_utf8_lossy(&name).to_ascii_lowercase();
                self.shared.borrow_mut().set_var(name, value);
                Ok(None)
            }
            b"if" | b"elif" => {
                if cmd == b"if" && self.conditional != 0 {
                    self.log(format_args!("the \"if\" command inside the \"if\" command"));
                    return Err(Failed);
                }
                if self.output_chosen {
                    self.output = false;
                    return Ok(None);
                }
                let yes = self.expr(req, &p().unwrap_or_default())?;
                self.output = yes;
                self.output_chosen |= yes;
                self.conditional = 1;
                Ok(None)
            }
            b"else" => {
                self.output = !self.output_chosen;
                self.conditional = 2;
                Ok(None)
            }
            b"endif" => {
                self.output = true;
                self.output_chosen = false;
                self.conditional = 0;
                Ok(None)
            }
            b"block" => {
                let name = p().unwrap_or_default();
                self.shared.borrow_mut().blocks.push((name, Vec::new()));
                self.output = false;
                self.block = true;
                Ok(None)
            }
            _ => {
                // endblock
                self.output = true;
                self.block = false;
                Ok(None)
            }
        }
    }

    pub(super) fn include(
        &mut self,
        req: &Request,
        virt: Option<Vec<u8>>,
        file: Option<Vec<u8>>,
        wait: Option<Vec<u8>>,
        set: Option<Vec<u8>>,
        stub: Option<Vec<u8>>,
    ) -> Result<Include, Failed> {
        // nginx waits for `wait="yes"` and every `file=` include before parsing on.
        let waited = file.is_some()
            || wait
                .as_deref()
                .is_some_and(|w| w.eq_ignore_ascii_case(b"yes"));
        let uri = match (virt, file) {
            (Some(u), Some(f)) => {
                self.log(format_args!(
                    "inclusion may be either virtual=\"{}\" or file=\"{}\"",
                    lossy(&u),
                    lossy(&f)
                ));
                return Err(Failed);
            }
            (None, None) => {
                self.log(format_args!("no parameter in \"include\" SSI command"));
                return Err(Failed);
            }
            (Some(u), None) => {
                if let Some(w) = &wait {
                    if !w.eq_ignore_ascii_case(b"no") && !w.eq_ignore_ascii_case(b"yes") {
                        self.log(format_args!(
                            "invalid value \"{}\" in the \"wait\" parameter",
                            lossy(w)
                        ));
                        return Err(Failed);
                    }
                }
                u
            }
            (None, Some(f)) => {
                if wait.is_some() {
                    self.log(format_args!(
                        "\"wait\" cannot be used with file=\"{}\"",
                        lossy(&f)
                    ));
                    return Err(Failed);
                }
                f
            }
        };
        if set.is_some() && stub.is_some() {
            self.log(format_args!(
                "\"set\" and \"stub\" cannot be used together in \"include\" SSI command"
            ));
            return Err(Failed);
        }
        let mut uri = self.evaluate(req, &uri, false)?;
        if uri.first() != Some(&b'/') {
            // Relative to the page's directory.
            let dir = match req.uri.rfind('/') {
                Some(i) => &req.uri[..=i],
                None => "",
            };
            let mut full = dir.as_bytes().to_vec();
            full.extend_from_slice(&uri);
            uri = full;
        }
        let uri = String::from_utf8_lossy(&uri).into_owned();
        // nginx's ngx_http_parse_unsafe_uri: the arguments after the first `?`, the path
        // percent-decoded (an escaped `?` stays in it), no "..", no NUL.
        let args = uri.split_once('?').map(|(_, a)| a.to_string());
        let Some(path) = crate::http::unsafe_uri(&uri) else {
            let path = uri.split('?').next().unwrap_or_default();
            self.log(format_args!("unsafe URI \"{path}\" was detected"));
            return Err(Failed);
        };
        let stub = match stub {
            Some(name) => match self.shared.borrow().block(&name) {
                Some(b) => Some(b),
                None => {
                    self.log(format_args!(
                        "\"stub\"=\"{}\" for \"include\" not found",
                        lossy(&name)
                    ));
                    return Err(Failed);
                }
            },
            None => None,
        };
        // nginx counts 51 levels down from the main request (NGX_HTTP_MAX_SUBREQUESTS + 1).
        if self.depth > MAX_DEPTH {
            self.log(format_args!(
                "subrequests cycle while processing \"{path}\""
            ));
            return Err(Failed);
        }
        Ok(Include {
            uri: path,
            args,
            wait: waited || set.is_some(),
            set: set.map(|s| String::from_utf8_lossy(&s).to_ascii_lowercase()),
            stub,
        })
    }

    pub(super) fn echo(
        &mut self,
        req: &Request,
        var: Option<Vec<u8>>,
        default: Option<Vec<u8>>,
        encoding: Option<Vec<u8>>,
        out: &mut Vec<u8>,
    ) -> Result<(), Failed> {
        let name = String::from_utf8_lossy(&var.unwrap_or_default()).to_ascii_lowercase();
        let value = match self.lookup(req, &name) {
            Some(v) => v,
            None => default.unwrap_or_else(|| b"(none)".to_vec()),
        };
        if value.is_empty() {
            return Ok(());
        }
        if let Some(e) = encoding {
            match e.as_slice() {
                b"none" => self.encoding = Encoding::None,
                b"url" => self.encoding = Encoding::Url,
                b"entity" => self.encoding = Encoding::Entity,
                _ => self.log(format_args!(
                    "unknown encoding \"{}\" in the \"echo\" command",
                    lossy(&e)
                )),
            }
        }
        match self.encoding {
            Encoding::None => out.extend_from_slice(&value),
            Encoding::Url => {
                for &b in &value {
                    // nginx's NGX_ESCAPE_HTML table: controls, non-ASCII and these.
                    if b <= b' '
                        || b >= 0x7f
                        || matches!(
                            b,
                            b'"' | b'#'
                                | b'%'
                                | b'\''
                                | b'<'
                                | b'>'
                                | b'\\'
                                | b'^'
                                | b'`'
                                | b'{'
                                | b'|'
                                | b'}'
                        )
                    {
                        out.extend_from_slice(format!("%{b:02X}").as_bytes());
                    } else {
                        out.push(b);
                    }
                }
            }
            Encoding::Entity => {
                for &b in &value {
                    match b {
                        b'<' => out.extend_from_slice(b"&lt;"),
                        b'>' => out.extend_from_slice(b"&gt;"),
                        b'&' => out.extend_from_slice(b"&amp;"),
                        b'"' => out.extend_from_slice(b"&quot;"),
                        _ => out.push(b),
                    }
                }
            }
        }
        Ok(())
    }

    /// A variable's value: SSI's own (and captures), `$date_*` in this page's `timefmt`,
    /// else the request's; `None` when not found.
    pub(super) fn lookup(&self, req: &Request, name: &str) -> Option<Vec<u8>> {
        if let Some(v) = self.shared.borrow().var(name) {
            return Some(v.to_vec());
        }
        match name {
            "date_local" => Some(date(&self.timefmt, false)),
            "date_gmt" => Some(date(&self.timefmt, true)),
            _ => crate::http::variables::lookup(name, req).map(String::into_bytes),
        }
    }

    /// nginx's ngx_http_ssi_evaluate_string: `$var` / `${var}` replaced, backslashes taken
    /// off before `\`, `'`, `"` and `$`.
    pub(super) fn evaluate(
        &self,
        req: &Request,
        text: &[u8],
        _regex: bool,
    ) -> Result<Vec<u8>, Failed> {
        let mut out = Vec::with_capacity(text.len());
        let mut i = 0;
        let mut quoted = false;
        while i < text.len() {
            let ch = text[i];
            if ch == b'$' && !quoted {
                i += 1;
                let bracket = text.get(i) == Some(&b'{');
                if bracket {
                    i += 1;
                }
                let start = i;
                while i < text.len() && (text[i].is_ascii_alphanumeric() || text[i] == b'_') {
                    i += 1;
                }
                let name = &text[start..i];
                if bracket {
                    if text.get(i) != Some(&b'}') {
                        self.log(format_args!(
                            "the closing bracket in \"{}\" variable is missing",
                            lossy(&text[start..])
                        ));
                        return Err(Failed);
                    }
                    i += 1;
                }
                if name.is_empty() {
                    self.log(format_args!("invalid variable name in \"{}\"", lossy(text)));
                    return Err(Failed);
                }
                let name = String::from_utf8_lossy(name).to_ascii_lowercase();
                if let Some(v) = self.lookup(req, &name) {
                    out.extend_from_slice(&v);
                }
                continue;
            }
            i += 1;
            if quoted {
                quoted = false;
                if !matches!(ch, b'\\' | b'\'' | b'"' | b'$') {
                    out.push(b'\\');
                }
            } else if ch == b'\\' {
                quoted = true;
                continue;
            }
            out.push(ch);
        }
        Ok(out)
    }

    /// `if expr=`: `$var`, `$a = text`, `$a != text`, `$a = /regex/`.
    pub(super) fn expr(&self, req: &Request, expr: &[u8]) -> Result<bool, Failed> {
        let mut lower = expr.to_vec();
        let mut p = 0;
        while p < lower.len() {
            let c = lower[p];
            if c.is_ascii_uppercase() {
                lower[p] = c.to_ascii_lowercase();
            } else if !(c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(c, b'$' | b'{' | b'}' | b'_' | b'"' | b'\''))
            {
                break;
            }
            p += 1;
        }
        let left = self.evaluate(req, &lower[..p], false)?;
        while expr.get(p) == Some(&b' ') {
            p += 1;
        }
        if p == expr.len() {
            return Ok(!left.is_empty());
        }
        let invalid = || {
            self.log(format_args!("invalid expression in \"{}\"", lossy(expr)));
            Failed
        };
        let negative = if expr[p] == b'=' {
            p += 1;
            false
        } else if expr[p] == b'!' && expr.get(p + 1) == Some(&b'=') {
            p += 2;
            true
        } else {
            return Err(invalid());
        };
        while expr.get(p) == Some(&b' ') {
            p += 1;
        }
        let mut last = expr.len();
        let regex = p + 1 < last && expr[p] == b'/';
        if regex {
            if expr[last - 1] != b'/' {
                return Err(invalid());
            }
            last -= 1;
            p += 1;
        } else if p + 1 < last && expr[p] == b'\\' && expr[p + 1] == b'/' {
            p += 1;
        }
        let right = self.evaluate(req, &expr[p..last.max(p)], regex)?;
        let matched = if regex {
            self.regex_match(&right, &left)?
        } else {
            left == right
        };
        Ok(matched != negative)
    }

    pub(super) fn regex_match(&self, pattern: &[u8], subject: &[u8]) -> Result<bool, Failed> {
        let re = match Regex::new(&String::from_utf8_lossy(pattern), false) {
            Ok(re) => re,
            Err(e) => {
                self.log(format_args!("{e}"));
                return Err(Failed);
            }
        };
        let Some(caps) = re.captures(subject) else {
            return Ok(false);
        };
        let mut sh = self.shared.borrow_mut();
        sh.captures = (0..caps.groups())
            .map(|i| caps.get(i).unwrap_or_default().to_vec())
            .collect();
        for (i, name) in re.names() {
            let v = caps.get(i).unwrap_or_default().to_vec();
            sh.set_var(name.to_ascii_lowercase(), v);
        }
        Ok(true)
    }
}

/// `$date_local` / `$date_gmt` in `fmt` (strftime's; `%s` alone is the Unix time).
pub fn date(fmt: &[u8], gmt: bool) -> Vec<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    if fmt == b"%s" {
        return now.to_string().into_bytes();
    }
    let Ok(cfmt) = std::ffi::CString::new(fmt) else {
        return Vec::new();
    };
    let t = now as libc::time_t;
    // SAFETY: an all-zero `tm` is a valid value (plain integers and a null zone pointer).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: pointers to live values of this frame; the *_r variants only write `tm`.
    let ok = unsafe {
        if gmt {
            !libc::gmtime_r(&t, &mut tm).is_null()
        } else {
            !libc::localtime_r(&t, &mut tm).is_null()
        }
    };
    if !ok {
        return Vec::new();
    }
    // nginx's NGX_HTTP_SSI_DATE_LEN.
    let mut buf = vec![0u8; 2048];
    // SAFETY: `buf` has `buf.len()` writable bytes, `cfmt` is NUL-terminated and `tm` is
    // initialised; strftime writes at most `buf.len()` bytes and returns how many.
    let n = unsafe {
        libc::strftime(
            buf.as_mut_ptr().cast::<libc::c_char>(),
            buf.len(),
            cfmt.as_ptr(),
            &tm,
        )
    };
    buf.truncate(n);
    buf
}
