//! The SSI command parser: nginx's state machine byte for byte (`<!--#`, the command name,
//! the parameters and their quoting, `-->`), run over each piece of the body as it passes.

use super::*;

impl Stream {
    /// Run through `input` from `self.pos`, text into `text`, until a command or an error
    /// is complete or the input ends.
    pub(super) fn parse(&mut self, input: &[u8], text: &mut Vec<u8>) -> Parsed {
        while self.pos < input.len() {
            let ch = input[self.pos];
            self.pos += 1;
            if self.state == State::Start {
                // The tight loop: plain text up to the next '<'.
                let rest = &input[self.pos - 1..];
                match memchr::memchr(b'<', rest) {
                    Some(i) => {
                        text.extend_from_slice(&rest[..i]);
                        self.pos += i;
                        self.looked = 1;
                        self.state = State::Tag;
                    }
                    None => {
                        text.extend_from_slice(rest);
                        self.pos = input.len();
                    }
                }
                continue;
            }
            match self.state {
                State::Start => {}
                State::Tag | State::Comment0 | State::Comment1 | State::Sharp => {
                    let want = match self.state {
                        State::Tag => b'!',
                        State::Sharp => b'#',
                        _ => b'-',
                    };
                    if ch == want {
                        self.looked += 1;
                        self.state = match self.state {
                            State::Tag => State::Comment0,
                            State::Comment0 => State::Comment1,
                            State::Comment1 => State::Sharp,
                            _ => {
                                self.looked = 0;
                                State::Precommand
                            }
                        };
                    } else {
                        // Not a command: the prefix was text; `ch` starts afresh.
                        text.extend_from_slice(&b"<!--"[..self.looked]);
                        if ch == b'<' {
                            self.looked = 1;
                            self.state = State::Tag;
                        } else {
                            text.push(ch);
                            self.looked = 0;
                            self.state = State::Start;
                        }
                    }
                }
                State::Precommand => {
                    if !is_space(ch) {
                        self.command.clear();
                        self.command.push(ch);
                        self.params.clear();
                        self.state = State::Command;
                    }
                }
                State::Command => match ch {
                    c if is_space(c) => self.state = State::Preparam,
                    b'-' => self.state = State::CommentEnd0,
                    _ => {
                        if self.command.len() == COMMAND_LEN {
                            self.log(format_args!(
                                "the \"{}{}...\" SSI command is too long",
                                lossy(&self.command),
                                ch as char
                            ));
                            self.state = State::Error;
                        } else {
                            self.command.push(ch);
                        }
                    }
                },
                State::Preparam => match ch {
                    c if is_space(c) => {}
                    b'-' => self.state = State::CommentEnd0,
                    _ => {
                        self.params.push((vec![ch], Vec::new()));
                        self.state = State::Param;
                    }
                },
                State::Param => match ch {
                    c if is_space(c) => self.state = State::Preequal,
                    b'=' => self.state = State::Prevalue,
                    b'-' => {
                        self.log(format_args!(
                            "unexpected \"-\" symbol after \"{}\" parameter in \"{}\" SSI command",
                            lossy(self.key()),
                            lossy(&self.command)
                        ));
                        self.state = State::ErrorEnd0;
                    }
                    _ => {
                        if self.key().len() == PARAM_LEN {
                            self.log(format_args!(
                                "too long \"{}{}...\" parameter in \"{}\" SSI command",
                                lossy(self.key()),
                                ch as char,
                                lossy(&self.command)
                            ));
                            self.state = State::Error;
                        } else if let Some(p) = self.params.last_mut() {
                            p.0.push(ch);
                        }
                    }
                },
                State::Preequal | State::Prevalue => match ch {
                    c if is_space(c) => {}
                    b'=' if self.state == State::Preequal => self.state = State::Prevalue,
                    b'"' if self.state == State::Prevalue => self.state = State::DoubleQuoted,
                    b'\'' if self.state == State::Prevalue => self.state = State::Quoted,
                    _ => {
                        let where_ = if self.state == State::Preequal {
                            "after"
                        } else {
                            "before value of"
                        };
                        self.log(format_args!(
                            "unexpected \"{}\" symbol {where_} \"{}\" parameter in \"{}\" SSI command",
                            ch as char,
                            lossy(self.key()),
                            lossy(&self.command)
                        ));
                        self.state = if ch == b'-' {
                            State::ErrorEnd0
                        } else {
                            State::Error
                        };
                    }
                },
                State::DoubleQuoted | State::Quoted => {
                    let close = if self.state == State::DoubleQuoted {
                        b'"'
                    } else {
                        b'\''
                    };
                    if ch == close {
                        self.state = State::Postparam;
                    } else {
                        if ch == b'\\' {
                            self.saved_state = self.state;
                            self.state = State::QuotedSymbol;
                        }
                        self.value_byte(ch);
                    }
                }
                State::QuotedSymbol => {
                    self.state = self.saved_state;
                    self.value_byte(ch);
                }
                State::Postparam => match ch {
                    c if is_space(c) => self.state = State::Preparam,
                    b'-' => self.state = State::CommentEnd0,
                    _ => {
                        let value = self.params.last().map(|p| p.1.clone()).unwrap_or_default();
                        self.log(format_args!(
                            "unexpected \"{}\" symbol after \"{}\" value of \"{}\" parameter in \"{}\" SSI command",
                            ch as char,
                            lossy(&value),
                            lossy(self.key()),
                            lossy(&self.command)
                        ));
                        self.state = State::Error;
                    }
                },
                State::CommentEnd0 | State::CommentEnd1 => {
                    let want = if self.state == State::CommentEnd0 {
                        b'-'
                    } else {
                        b'>'
                    };
                    if ch != want {
                        self.log(format_args!(
                            "unexpected \"{}\" symbol in \"{}\" SSI command",
                            ch as char,
                            lossy(&self.command)
                        ));
                        self.state = State::Error;
                    } else if self.state == State::CommentEnd0 {
                        self.state = State::CommentEnd1;
                    } else {
                        self.state = State::Start;
                        return Parsed::Command;
                    }
                }
                State::Error => {
                    if ch == b'-' {
                        self.state = State::ErrorEnd0;
                    }
                }
                State::ErrorEnd0 => {
                    self.state = if ch == b'-' {
                        State::ErrorEnd1
                    } else {
                        State::Error
                    };
                }
                State::ErrorEnd1 => {
                    if ch == b'>' {
                        self.state = State::Start;
                        return Parsed::Error;
                    }
                    self.state = State::Error;
                }
            }
        }
        Parsed::Again
    }

    pub(super) fn key(&self) -> &[u8] {
        self.params
            .last()
            .map(|p| p.0.as_slice())
            .unwrap_or_default()
    }

    /// A byte of a quoted value, up to `ssi_value_length`.
    pub(super) fn value_byte(&mut self, ch: u8) {
        let limit = self.setup.value_len();
        let Some((key, value)) = self.params.last_mut() else {
            return;
        };
        if value.len() >= limit {
            let (v, k) = (lossy(value).into_owned(), lossy(key).into_owned());
            self.log(format_args!(
                "too long \"{v}{}...\" value of \"{k}\" parameter in \"{}\" SSI command",
                ch as char,
                lossy(&self.command)
            ));
            self.state = State::Error;
        } else {
            value.push(ch);
        }
    }
}
