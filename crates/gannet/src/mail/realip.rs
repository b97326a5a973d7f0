//! `set_real_ip_from` in the mail context (nginx's ngx_mail_realip_module): a session
//! from a trusted address that opened with a PROXY protocol header (`listen ...
//! proxy_protocol`) takes the header's client address, the one the auth server
//! (`Client-IP`), XCLIENT and the logs then see. The trust rules are the stream module's.

use super::handler::Session;

/// Take the PROXY header's client address when the connection is trusted.
pub fn apply(s: &mut Session) {
    let Some(client) = s.proxy_protocol.as_ref().and_then(|p| p.client()) else {
        return;
    };
    if s.srv.conf.realip.trusts(s.peer, s.unix) {
        s.peer = client;
        s.unix = false;
    }
}
