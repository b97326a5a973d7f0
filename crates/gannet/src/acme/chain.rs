//! `preferred_chain NAME`: when the CA offers alternate chains (RFC 8555 7.4.2, `Link:
//! <URL>;rel="alternate"` on the certificate's download), the first whose topmost
//! certificate was issued by the common name NAME is kept, else the default one, as
//! nginx-acme picks.
//!
//! The ACME crate neither reports the links nor fetches another chain, so the HTTP client
//! it talks through (`Tap`) notes the links of every response, and an alternate is fetched
//! through the crate's own signed requests: the order is read again with its `certificate`
//! URL swapped for the alternate's in the JSON the CA sent, and that order's certificate
//! downloaded.

use super::account_key::AccountKey;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// What the client noted and what it is to rewrite, shared with the orders.
#[derive(Debug, Default)]
pub struct Links {
    /// The alternates each URL's response named.
    alternates: Mutex<HashMap<String, Vec<String>>>,
    /// Order URL -> the certificate URL its next response is to name.
    swap: Mutex<HashMap<String, String>>,
    /// The account key that signs the requests again, and the external account binding's
    /// MAC key (see `account_key`).
    signer: Mutex<Option<Resigner>>,
}

/// The account key requests are signed again with, and the binding's MAC key.
type Resigner = (Arc<AccountKey>, Option<Vec<u8>>);

impl Links {
    /// The alternate chains of the certificate at `url`, as its download named them.
    pub fn alternates(&self, url: &str) -> Vec<String> {
        self.alternates
            .lock()
            .ok()
            .and_then(|m| m.get(url).cloned())
            .unwrap_or_default()
    }

    /// Have the next response to `order_url` name `cert_url` as the certificate.
    pub fn swap(&self, order_url: &str, cert_url: &str) {
        if let Ok(mut m) = self.swap.lock() {
            m.insert(order_url.to_string(), cert_url.to_string());
        }
    }

    pub fn set_signer(&self, key: Arc<AccountKey>, eab: Option<Vec<u8>>) {
        if let Ok(mut g) = self.signer.lock() {
            *g = Some((key, eab));
        }
    }

    pub fn signer(&self) -> Option<Arc<AccountKey>> {
        self.signer.lock().ok()?.as_ref().map(|(k, _)| k.clone())
    }

    pub fn unswap(&self, order_url: &str) {
        if let Ok(mut m) = self.swap.lock() {
            m.remove(order_url);
        }
    }
}

/// The HTTP client the ACME crate is given: the real one, with the links noted.
pub struct Tap {
    pub inner: Arc<dyn HttpClient>,
    pub links: Arc<Links>,
}

impl HttpClient for Tap {
    fn request(
        &self,
        req: http::Request<BodyWrapper<bytes::Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let url = req.uri().to_string();
        let links = self.links.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let signer = links.signer.lock().ok().and_then(|g| g.clone());
            let req = match signer {
                Some((key, eab)) if req.method() == http::Method::POST => {
                    use http_body_util::BodyExt;
                    let (parts, body) = req.into_parts();
                    let body = match body.collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(never) => match never {},
                    };
                    let signed = key
                        .resign(&body, eab.as_deref())
                        .map_err(|e| instant_acme::Error::Other(e.into()))?;
                    let mut req = http::Request::from_parts(parts, BodyWrapper::from(signed));
                    req.headers_mut().remove(http::header::CONTENT_LENGTH);
                    req
                }
                _ => req,
            };
            let mut rsp = inner.request(req).await?;
            let alternates = alternate_links(&rsp.parts.headers, &url);
            if !alternates.is_empty() {
                if let Ok(mut m) = links.alternates.lock() {
                    // Only the certificates of orders in flight matter: keep it small.
                    if m.len() > 64 {
                        m.clear();
                    }
                    m.insert(url.clone(), alternates);
                }
            }
            let swap = links.swap.lock().ok().and_then(|m| m.get(&url).cloned());
            if let Some(cert_url) = swap {
                let body = rsp
                    .body
                    .into_bytes()
                    .await
                    .map_err(instant_acme::Error::Other)?;
                let body = match serde_json::from_slice::<serde_json::Value>(&body) {
                    Ok(mut v) if v.get("certificate").is_some() => {
                        v["certificate"] = serde_json::Value::String(cert_url);
                        serde_json::to_vec(&v).map_or(body, bytes::Bytes::from)
                    }
                    _ => body,
                };
                rsp.parts.headers.remove(http::header::CONTENT_LENGTH);
                rsp.body = Box::new(body);
            }
            Ok(rsp)
        })
    }
}

/// The `rel="alternate"` targets of a response's Link headers, made absolute against the
/// request's URL.
fn alternate_links(headers: &http::HeaderMap, base: &str) -> Vec<String> {
    let mut out = Vec::new();
    for v in headers.get_all(http::header::LINK) {
        let Ok(v) = v.to_str() else { continue };
        // `<URL>; rel="alternate", <URL2>; rel="up"`: each link is `<...>` and its params.
        let mut rest = v;
        while let Some(start) = rest.find('<') {
            let Some(len) = rest[start..].find('>') else {
                break;
            };
            let target = &rest[start + 1..start + len];
            let after = &rest[start + len + 1..];
            let params = after.split('<').next().unwrap_or_default();
            let alternate = params.split(';').any(|p| {
                p.trim().split_once('=').is_some_and(|(k, v)| {
                    k.trim() == "rel" && v.trim().trim_matches('"') == "alternate"
                })
            });
            if alternate {
                out.push(absolute(target, base));
            }
            rest = after;
        }
    }
    out
}

fn absolute(target: &str, base: &str) -> String {
    if target.contains("://") {
        return target.to_string();
    }
    let Ok(b) = base.parse::<http::Uri>() else {
        return target.to_string();
    };
    let origin = format!(
        "{}://{}",
        b.scheme_str().unwrap_or("https"),
        b.authority().map_or("", |a| a.as_str())
    );
    if target.starts_with('/') {
        return format!("{origin}{target}");
    }
    let dir = b.path().rsplit_once('/').map_or("", |(d, _)| d);
    format!("{origin}{dir}/{target}")
}

/// Whether the chain's topmost certificate was issued by the common name `name`.
pub fn issued_by(chain_pem: &str, name: &str) -> bool {
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .filter_map(Result::ok)
        .collect();
    let Some(top) = certs.last() else {
        return false;
    };
    x509_parser::parse_x509_certificate(top).is_ok_and(|(_, c)| {
        c.issuer()
            .iter_common_name()
            .any(|cn| cn.as_str() == Ok(name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternate_links_are_found_and_made_absolute() {
        let mut h = http::HeaderMap::new();
        h.append(
            http::header::LINK,
            "<https://ca/dir>;rel=\"index\", <https://ca/cert/1/1>; rel=\"alternate\""
                .parse()
                .unwrap(),
        );
        h.append(
            http::header::LINK,
            "</cert/1/2>;rel=alternate".parse().unwrap(),
        );
        h.append(http::header::LINK, "<2b>;rel=\"up\"".parse().unwrap());
        assert_eq!(
            alternate_links(&h, "https://ca:14000/cert/1"),
            ["https://ca/cert/1/1", "https://ca:14000/cert/1/2"]
        );
    }
}
