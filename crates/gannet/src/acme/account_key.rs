//! Account keys the ACME crate cannot sign with (`account_key ecdsa:384 | ecdsa:521 |
//! rsa:N`, or a key file of those types): instant-acme 0.8 signs every request with an
//! ECDSA P-256 key of its own. For another key, the crate is given a throwaway P-256 key,
//! and the HTTP client it talks through (`chain::Tap`) signs each request again with the
//! account's real key before it leaves: the JWS protected header gets the key's `alg` (and
//! its JWK where the crate put its own), the signature is the real key's (aws-lc-rs), and
//! an external account binding names the real key, MACed again. Key authorizations are
//! made with the real key's thumbprint (RFC 7638).

use super::KeyAlg;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use data_encoding::BASE64URL_NOPAD as B64;
use serde_json::{json, Value};

enum Signer {
    Ec(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A non-P-256 account key, with its JWK and thumbprint.
pub struct AccountKey {
    signer: Signer,
    alg: &'static str,
    jwk: Value,
    thumbprint: String,
}

impl std::fmt::Debug for AccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountKey")
            .field("alg", &self.alg)
            .finish()
    }
}

/// A new key of the type `account_key` names, as PKCS#8 PEM.
pub fn generate(alg: KeyAlg) -> Result<String, rcgen::Error> {
    Ok(super::client::generate(alg)?.serialize_pem())
}

impl AccountKey {
    /// The key in `pem` when it is not ECDSA P-256 (which the crate signs itself: `None`).
    pub fn from_pem(pem: &[u8]) -> Result<Option<AccountKey>, String> {
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem)
            .map_err(|e| format!("account key is not a PKCS#8 PEM key: {e}"))?;
        let der = der.secret_pkcs8_der();
        if EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, der).is_ok() {
            return Ok(None);
        }
        let ec = |alg, crv: &str, name: &'static str, half: usize| {
            EcdsaKeyPair::from_pkcs8(alg, der).ok().map(|k| {
                let point = k.public_key().as_ref();
                let (x, y) = point
                    .get(1..)
                    .unwrap_or_default()
                    .split_at(half.min(point.len().saturating_sub(1)));
                let jwk = json!({"crv": crv, "kty": "EC", "x": B64.encode(x), "y": B64.encode(y)});
                (Signer::Ec(k), name, jwk)
            })
        };
        let found = ec(
            &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            "P-384",
            "ES384",
            48,
        )
        .or_else(|| {
            ec(
                &signature::ECDSA_P521_SHA512_FIXED_SIGNING,
                "P-521",
                "ES512",
                66,
            )
        })
        .or_else(|| {
            let k = RsaKeyPair::from_pkcs8(der).ok()?;
            let (n, e) = rsa_components(k.public_key().as_ref())?;
            let jwk = json!({"e": B64.encode(&e), "kty": "RSA", "n": B64.encode(&n)});
            Some((Signer::Rsa(k), "RS256", jwk))
        });
        let (signer, alg, jwk) = found.ok_or("unsupported account key type")?;
        // RFC 7638: the required members, sorted (serde_json's map is), no whitespace.
        let canonical = serde_json::to_vec(&jwk).map_err(|e| e.to_string())?;
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &canonical);
        Ok(Some(AccountKey {
            signer,
            alg,
            jwk,
            thumbprint: B64.encode(digest.as_ref()),
        }))
    }

    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, String> {
        let rng = SystemRandom::new();
        match &self.signer {
            Signer::Ec(k) => k
                .sign(&rng, msg)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| "signing failed".to_string()),
            Signer::Rsa(k) => {
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &rng, msg, &mut sig)
                    .map_err(|_| "signing failed".to_string())?;
                Ok(sig)
            }
        }
    }

    /// `token.thumbprint` (RFC 8555 8.1) with this key.
    pub fn key_authorization(&self, token: &str) -> String {
        format!("{token}.{}", self.thumbprint)
    }

    /// A request's flattened JWS signed again with this key (`eab`: the external account
    /// binding's MAC key, to bind this key instead of the crate's).
    pub fn resign(&self, body: &[u8], eab: Option<&[u8]>) -> Result<Vec<u8>, String> {
        let bad = |what: &str| format!("cannot re-sign the ACME request: {what}");
        let jws: Value = serde_json::from_slice(body).map_err(|e| bad(&e.to_string()))?;
        let field = |v: &Value, k: &str| -> Result<Vec<u8>, String> {
            let s = v.get(k).and_then(Value::as_str).ok_or_else(|| bad(k))?;
            B64.decode(s.as_bytes()).map_err(|e| bad(&e.to_string()))
        };
        let mut header: Value =
            serde_json::from_slice(&field(&jws, "protected")?).map_err(|e| bad(&e.to_string()))?;
        header["alg"] = Value::from(self.alg);
        if header.get("jwk").is_some() {
            header["jwk"] = self.jwk.clone();
        }
        let mut payload = field(&jws, "payload")?;
        if let (Some(mac), Ok(mut p)) = (eab, serde_json::from_slice::<Value>(&payload)) {
            if let Some(binding) = p.get_mut("externalAccountBinding") {
                let protected = binding
                    .get("protected")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("externalAccountBinding"))?
                    .to_string();
                let inner =
                    B64.encode(&serde_json::to_vec(&self.jwk).map_err(|e| bad(&e.to_string()))?);
                let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, mac);
                let tag = aws_lc_rs::hmac::sign(&key, format!("{protected}.{inner}").as_bytes());
                binding["payload"] = Value::from(inner);
                binding["signature"] = Value::from(B64.encode(tag.as_ref()));
                payload = serde_json::to_vec(&p).map_err(|e| bad(&e.to_string()))?;
            }
        }
        let protected = B64.encode(&serde_json::to_vec(&header).map_err(|e| bad(&e.to_string()))?);
        // POST-as-GET keeps its empty payload.
        let payload = if payload.is_empty() {
            String::new()
        } else {
            B64.encode(&payload)
        };
        let sig = self.sign(format!("{protected}.{payload}").as_bytes())?;
        serde_json::to_vec(&json!({
            "protected": protected,
            "payload": payload,
            "signature": B64.encode(&sig),
        }))
        .map_err(|e| bad(&e.to_string()))
    }
}

/// The modulus and exponent of a PKCS#1 RSAPublicKey, without leading zeros.
fn rsa_components(der_bytes: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    use der::asn1::UintRef;
    use der::{Decode, Reader, SliceReader};
    let mut r = SliceReader::new(der_bytes).ok()?;
    let (n, e) = r
        .sequence(|s| {
            let n = UintRef::decode(s)?;
            let e = UintRef::decode(s)?;
            Ok((n.as_bytes().to_vec(), e.as_bytes().to_vec()))
        })
        .ok()?;
    Some((n, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_each_type_and_p256_left_to_the_crate() {
        let p256 = generate(KeyAlg::Ecdsa(256)).unwrap();
        assert!(AccountKey::from_pem(p256.as_bytes()).unwrap().is_none());
        for (alg, name) in [
            (KeyAlg::Ecdsa(384), "ES384"),
            (KeyAlg::Ecdsa(521), "ES512"),
            (KeyAlg::Rsa(2048), "RS256"),
        ] {
            let k = AccountKey::from_pem(generate(alg).unwrap().as_bytes())
                .unwrap()
                .unwrap();
            assert_eq!(k.alg, name);
            let body = br#"{"protected":"eyJhbGciOiJFUzI1NiIsImp3ayI6e319","payload":"e30","signature":"x"}"#;
            let out: Value = serde_json::from_slice(&k.resign(body, None).unwrap()).unwrap();
            let header: Value = serde_json::from_slice(
                &B64.decode(out["protected"].as_str().unwrap().as_bytes())
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(header["alg"], name);
            assert_eq!(header["jwk"], k.jwk);
        }
        let rsa = AccountKey::from_pem(generate(KeyAlg::Rsa(2048)).unwrap().as_bytes())
            .unwrap()
            .unwrap();
        // e = 65537.
        assert_eq!(rsa.jwk["e"], "AQAB");
    }
}
