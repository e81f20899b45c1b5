//! Starting the real `tandem` binary for end-to-end tests.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tandem");
pub const KEY: &str = "e2e-test-key";

/// The model file the server is started with (`make test` sets TANDEM_TEST_MODEL).
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("TANDEM_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(path.is_file(), "{} is missing: run `make model` (or `make test`)", path.display());
    path
}

pub struct Server {
    pub child: Child,
    pub url: String,
    /// Lines the server printed on stdout before the address line.
    pub banner: Vec<String>,
}

impl Server {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let model = model_path();
        #[allow(clippy::zombie_processes)] // waited for in Drop
        let mut child = Command::new(BIN)
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
            .arg(data_dir)
            .arg("--model")
            .arg(&model)
            .args(extra)
            .env("TANDEM_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tandem");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut banner = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "server did not start");
            let line = lines.next().expect("server exited before listening").unwrap();
            if let Some(url) = line.strip_prefix("tandem listening on ") {
                let url = url.trim().to_string();
                // Keep draining stdout so the server never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines.by_ref() {});
                return Server { child, url, banner };
            }
            banner.push(line);
        }
    }

    pub fn kill9(self) {
        drop(self);
    }
}

impl Drop for Server {
    /// A test that fails midway still leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL on Unix
        let _ = self.child.wait();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

pub async fn post(c: &reqwest::Client, url: &str, key: &str, body: &Value) -> reqwest::Result<(u16, Value)> {
    let r = c.post(url).bearer_auth(key).json(body).send().await?;
    let status = r.status().as_u16();
    Ok((status, r.json().await.unwrap_or(Value::Null)))
}
