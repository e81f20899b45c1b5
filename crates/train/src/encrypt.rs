//! Encrypted exports (Tinker's `age_encryption_recipients` on `save_weights_external`): every
//! file encrypted to the given age recipients (native `age1...` X25519 keys or SSH public keys)
//! with the `age` crate, the reference format the `age` and `rage` tools decrypt
//! (`age -d -i <identity>`). The server never holds an identity: what it writes, only the
//! recipients can read.

use age::Recipient;
use std::io::Write;

/// At most this many recipients, as Tinker allows.
pub const MAX_RECIPIENTS: usize = 10;

/// The parsed recipients of one export.
pub struct Recipients(Vec<Box<dyn Recipient + Send + Sync>>);

impl Recipients {
    /// Parses each of `list`: an `age1...` key, or an `ssh-ed25519`/`ssh-rsa` public key (its
    /// comment ignored). An error names the one that is not a recipient.
    pub fn parse(list: &[String]) -> Result<Self, String> {
        if list.is_empty() || list.len() > MAX_RECIPIENTS {
            return Err(format!("age_encryption_recipients: {} given, expected 1 to {MAX_RECIPIENTS}", list.len()));
        }
        let mut out: Vec<Box<dyn Recipient + Send + Sync>> = Vec::with_capacity(list.len());
        for (i, text) in list.iter().enumerate() {
            let text = text.trim();
            let parsed: Option<Box<dyn Recipient + Send + Sync>> = if text.starts_with("age1") {
                text.parse::<age::x25519::Recipient>().ok().map(|r| Box::new(r) as _)
            } else if text.starts_with("ssh-") {
                text.parse::<age::ssh::Recipient>().ok().map(|r| Box::new(r) as _)
            } else {
                None
            };
            let shown: String = text.chars().take(24).collect();
            out.push(parsed.ok_or_else(|| {
                format!(
                    "age_encryption_recipients[{i}] ({shown:?}...) is not an age recipient: expected an age1... key or an \
                     ssh-ed25519 or ssh-rsa (2048 bits or more) public key"
                )
            })?);
        }
        Ok(Recipients(out))
    }

    /// `plain` encrypted to every recipient (any one of their identities decrypts it).
    pub fn encrypt(&self, plain: &[u8]) -> Result<Vec<u8>, String> {
        let fail = |e: &dyn std::fmt::Display| format!("encrypting the export: {e}");
        let encryptor = age::Encryptor::with_recipients(self.0.iter().map(|r| r.as_ref() as &dyn Recipient))
            .map_err(|e| fail(&e))?;
        let mut out = Vec::with_capacity(plain.len() + 512);
        let mut writer = encryptor.wrap_output(&mut out).map_err(|e| fail(&e))?;
        writer.write_all(plain).map_err(|e| fail(&e))?;
        writer.finish().map_err(|e| fail(&e))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_recipient_decrypts_and_nothing_else_is_a_recipient() {
        let (a, b) = (age::x25519::Identity::generate(), age::x25519::Identity::generate());
        let list = vec![a.to_public().to_string(), format!("  {}  ", b.to_public())];
        let r = Recipients::parse(&list).unwrap();
        let plain = b"adapter_model.safetensors bytes".repeat(1000);
        let sealed = r.encrypt(&plain).unwrap();
        assert_ne!(&sealed[..plain.len().min(sealed.len())], &plain[..plain.len().min(sealed.len())]);
        assert_eq!(age::decrypt(&a, &sealed).unwrap(), plain);
        assert_eq!(age::decrypt(&b, &sealed).unwrap(), plain);
        assert!(age::decrypt(&age::x25519::Identity::generate(), &sealed).is_err(), "another identity");
        // An SSH ed25519 public key is a recipient too.
        let ssh = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1oLuTDv7LRmFvmLxzltWJKTqg5uNpj2km+pY4bFEr2 test";
        assert!(Recipients::parse(&[ssh.to_string()]).is_ok());
        for bad in [vec![], vec!["age1notakey".to_string()], vec!["hello".to_string()], vec![list[0].clone(); 11]] {
            assert!(Recipients::parse(&bad).is_err(), "{bad:?}");
        }
        let e = Recipients::parse(&[list[0].clone(), "nope".into()]).err().unwrap();
        assert!(e.contains("[1]"), "{e}");
    }
}
