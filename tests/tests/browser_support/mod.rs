//! A headless Chromium driven through ChromeDriver's W3C WebDriver API (JSON over HTTP), for the
//! pages the demo serves. Needs `chromedriver` and `chromium` (Debian: `apt-get install
//! chromium chromium-driver`; `.ci/test` installs them when missing).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A ChromeDriver process with one headless browser session.
pub(crate) struct Browser {
    driver: tokio::process::Child,
    addr: SocketAddr,
    session: String,
}

impl Browser {
    /// Starts ChromeDriver on a free port and a headless Chromium session.
    pub(crate) async fn start() -> Self {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("bound").port()
        };
        let driver = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver runs (Debian: apt-get install chromium chromium-driver)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(status) = call(addr, "GET", "/status", None).await
                && status["value"]["ready"] == true
            {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "chromedriver ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .unwrap_or("chromium");
        let created = call(
            addr,
            "POST",
            "/session",
            Some(json!({
                "capabilities": { "alwaysMatch": { "goog:chromeOptions": {
                    "binary": binary,
                    "args": ["--headless", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage"],
                }}}
            })),
        )
        .await
        .expect("a browser session");
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        Self {
            driver,
            addr,
            session,
        }
    }

    /// Opens `url` and waits for its load event.
    pub(crate) async fn open(&self, url: &str) {
        let path = format!("/session/{}/url", self.session);
        let answer = call(self.addr, "POST", &path, Some(json!({ "url": url })))
            .await
            .expect("navigate");
        assert!(answer["value"].is_null(), "navigate: {answer}");
    }

    /// Runs `script` (a function body that `return`s) in the page; its JSON result.
    pub(crate) async fn eval(&self, script: &str) -> Value {
        let path = format!("/session/{}/execute/sync", self.session);
        let answer = call(
            self.addr,
            "POST",
            &path,
            Some(json!({ "script": script, "args": [] })),
        )
        .await
        .expect("execute");
        answer["value"].clone()
    }

    /// Ends the browser session and ChromeDriver.
    pub(crate) async fn stop(mut self) {
        let path = format!("/session/{}", self.session);
        let _ = call(self.addr, "DELETE", &path, None).await;
        let _ = self.driver.kill().await;
    }
}

/// One WebDriver request: the answer's JSON.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> std::io::Result<Value> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    // ChromeDriver may keep the connection open whatever the request says: read the head, then
    // exactly the body its Content-Length announces (or chunks up to the last one).
    let read = async {
        let mut response = Vec::new();
        let mut buffer = [0u8; 8192];
        loop {
            let n = stream.read(&mut buffer).await?;
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&response);
            if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                let head = head.to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse::<usize>().ok());
                match length {
                    Some(length) if rest.len() >= length => break,
                    None if head.contains("transfer-encoding: chunked")
                        && rest.ends_with("0\r\n\r\n") =>
                    {
                        break;
                    }
                    _ => {}
                }
            }
        }
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(CALL_TIMEOUT, read)
        .await
        .map_err(|_| std::io::Error::other(format!("{method} {path}: no answer")))??;
    let response = String::from_utf8_lossy(&response);
    let (head, rest) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let json = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    serde_json::from_str(&json).map_err(std::io::Error::other)
}

/// How long one WebDriver call may take (a navigation included).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn dechunk(mut text: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        text = rest[size..].trim_start_matches("\r\n");
    }
    out
}
