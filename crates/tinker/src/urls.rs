//! The signed download URLs of external weights: a token carries the owner, the run, the name
//! and the expiry, with an HMAC-SHA256 of them, so a plain HTTP client (the SDK's download)
//! fetches the files without a key, and only what was signed, until it expires.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The key signed URLs are signed with: the cluster's, drawn by the first node that signs and
/// kept in the store ([`crate::Catalog::url_key`]), so a URL one node signs downloads from any.
pub struct UrlKey([u8; 32]);

impl Default for UrlKey {
    /// A random key (tests; a process of its own).
    fn default() -> Self {
        UrlKey(rand::random())
    }
}

impl UrlKey {
    /// A key from its 64 hex digits.
    pub fn from_hex(secret: &str) -> Option<Self> {
        let bytes = hex::decode(secret).ok()?;
        Some(UrlKey(bytes.try_into().ok()?))
    }

    /// A fresh random key's hex digits.
    pub fn fresh_hex() -> String {
        hex::encode(rand::random::<[u8; 32]>())
    }

    fn mac(&self, payload: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(payload.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// A token naming `owner`'s external weights `name` of `run`, good until `expires` (unix
    /// seconds): the fields hex-encoded (any bytes may be in an entity's name), then the MAC.
    pub fn sign(&self, owner: &str, run: &str, name: &str, expires: u64) -> String {
        let payload = format!("{}.{}.{}.{expires}", hex::encode(owner), hex::encode(run), hex::encode(name));
        let mac = self.mac(&payload);
        format!("{payload}.{mac}")
    }

    /// The (owner, run, name) of a token this key signed and that has not expired at `now`.
    pub fn verify(&self, token: &str, now: u64) -> Option<(String, String, String)> {
        let (payload, mac) = token.rsplit_once('.')?;
        // Compared in constant time (the MAC crate's check).
        let mut check = Hmac::<Sha256>::new_from_slice(&self.0).ok()?;
        check.update(payload.as_bytes());
        check.verify_slice(&hex::decode(mac).ok()?).ok()?;
        let mut parts = payload.split('.');
        let text = |p: Option<&str>| hex::decode(p?).ok().and_then(|b| String::from_utf8(b).ok());
        let (owner, run, name) = (text(parts.next())?, text(parts.next())?, text(parts.next())?);
        let expires: u64 = parts.next()?.parse().ok()?;
        (parts.next().is_none() && now < expires).then_some((owner, run, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_tokens_name_what_they_were_signed_for_until_they_expire() {
        let key = UrlKey::default();
        let token = key.sign("ent.ity/x", "s:train:0", "final", 1_000);
        assert_eq!(key.verify(&token, 999), Some(("ent.ity/x".into(), "s:train:0".into(), "final".into())));
        assert_eq!(key.verify(&token, 1_000), None, "expired");
        // Another key, a changed field or a changed MAC: refused.
        assert_eq!(UrlKey::default().verify(&token, 0), None);
        let (payload, mac) = token.rsplit_once('.').unwrap();
        let later = payload.replace(".1000", ".9999");
        assert_eq!(key.verify(&format!("{later}.{mac}"), 0), None);
        let mut bad_mac = mac.to_string();
        bad_mac.replace_range(0..1, if mac.starts_with('0') { "1" } else { "0" });
        assert_eq!(key.verify(&format!("{payload}.{bad_mac}"), 0), None);
        assert_eq!(key.verify("garbage", 0), None);
        // The same secret is the same key (two nodes of a cluster).
        let secret = UrlKey::fresh_hex();
        let (a, b) = (UrlKey::from_hex(&secret).unwrap(), UrlKey::from_hex(&secret).unwrap());
        assert!(b.verify(&a.sign("o", "r", "n", 10), 0).is_some());
        assert!(UrlKey::from_hex("abcd").is_none() && UrlKey::from_hex("zz").is_none());
    }
}
