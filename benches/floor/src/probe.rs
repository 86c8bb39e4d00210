//! `tollgate-bench-probe`: a few connections, each one request at a time, each request's
//! latency recorded exactly. The load bench's one-connection case (`json16@c1`) runs it
//! instead of wrk: at one connection wrk's own tail set the p99 for every target alike (a bare
//! Pingora proxy 0.28–1.42 ms, where a C client of this design measured 0.20–0.23 ms;
//! `docs/perf-notes.md`). With `-c` and `BENCH_DELAY_MS` it runs the
//! paced case the same way (one thread per connection, each waiting before every request).
//!
//! Usage mirrors wrk's, with `wrk_post.lua`'s environment:
//!   tollgate-bench-probe -d10s [-c5] http://127.0.0.1:PORT/v1/chat/completions
//!   BENCH_BODY_FILE (the JSON body, required), BENCH_TOKENS (x-mock-tokens, default 16),
//!   BENCH_API_KEY (sent as a bearer token when set), BENCH_DELAY_MS (each connection waits
//!   this long before each request; default 0), BENCH_TIMELINE (a file: one line per request,
//!   "sent_us latency_us", sent counted from the run's start, for finding what slow ones share)
//! It prints the same `BENCH ...` summary line as `wrk_post.lua`.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn main() {
    if let Err(e) = run() {
        eprintln!("tollgate-bench-probe: {e}");
        std::process::exit(2);
    }
}

#[derive(Default)]
struct Errors {
    connect: u64,
    read: u64,
    write: u64,
    status: u64,
    timeout: u64,
}

impl Errors {
    fn add(&mut self, other: &Errors) {
        self.connect += other.connect;
        self.read += other.read;
        self.write += other.write;
        self.status += other.status;
        self.timeout += other.timeout;
    }
}

fn run() -> Result<(), String> {
    let (seconds, connections, url) = args()?;
    let delay_ms: u64 = match std::env::var("BENCH_DELAY_MS") {
        Ok(d) if !d.is_empty() => d.parse().map_err(|_| format!("bad BENCH_DELAY_MS {d:?}"))?,
        _ => 0,
    };
    let delay = Duration::from_millis(delay_ms);
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let body_file = std::env::var("BENCH_BODY_FILE").map_err(|_| "BENCH_BODY_FILE is not set")?;
    let body = std::fs::read(&body_file).map_err(|e| format!("{body_file}: {e}"))?;
    let tokens = std::env::var("BENCH_TOKENS").unwrap_or_else(|_| "16".into());
    let auth = match std::env::var("BENCH_API_KEY") {
        Ok(k) if !k.is_empty() => format!("Authorization: Bearer {k}\r\n"),
        _ => String::new(),
    };
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nx-mock-tokens: {tokens}\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    // One thread per connection, each a closed loop like one of wrk's connections.
    let runs: Vec<Run> = std::thread::scope(|s| {
        let workers: Vec<_> =
            (0..connections).map(|_| s.spawn(|| one_connection(host, &request, started, deadline, delay))).collect();
        workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
    });
    let (mut latencies_ns, mut errors, mut bytes) = (Vec::new(), Errors::default(), 0u64);
    let mut timeline: Vec<(u64, u64)> = Vec::new();
    for run in runs {
        timeline.extend(run.sent_ns.iter().copied().zip(run.latencies_ns.iter().copied()));
        latencies_ns.extend(run.latencies_ns);
        errors.add(&run.errors);
        bytes += run.bytes;
    }
    let duration_us = started.elapsed().as_micros();
    if let Ok(path) = std::env::var("BENCH_TIMELINE") {
        timeline.sort_unstable();
        let text: String = timeline.iter().map(|(at, took)| format!("{} {}\n", at / 1_000, took / 1_000)).collect();
        std::fs::write(&path, text).map_err(|e| format!("{path}: {e}"))?;
    }
    latencies_ns.sort_unstable();
    let us = |p: f64| -> u64 {
        if latencies_ns.is_empty() {
            return 0;
        }
        // Nearest rank.
        let rank = ((p / 100.0) * latencies_ns.len() as f64).ceil() as usize;
        latencies_ns[rank.clamp(1, latencies_ns.len()) - 1] / 1_000
    };
    let mean_us = if latencies_ns.is_empty() {
        0.0
    } else {
        latencies_ns.iter().map(|&n| n as f64).sum::<f64>() / latencies_ns.len() as f64 / 1_000.0
    };
    println!(
        "BENCH requests={} duration_us={duration_us} bytes={bytes} p50_us={} p90_us={} p99_us={} p999_us={} max_us={} mean_us={mean_us:.1} err_connect={} err_read={} err_write={} err_status={} err_timeout={} shed=0",
        latencies_ns.len(),
        us(50.0),
        us(90.0),
        us(99.0),
        us(99.9),
        latencies_ns.last().map_or(0, |n| n / 1_000),
        errors.connect,
        errors.read,
        errors.write,
        errors.status,
        errors.timeout,
    );
    Ok(())
}

#[derive(Default)]
struct Run {
    latencies_ns: Vec<u64>,
    /// When each request was sent, in ns since the run began (BENCH_TIMELINE).
    sent_ns: Vec<u64>,
    errors: Errors,
    bytes: u64,
}

/// One connection's closed loop until the deadline: wait `delay` (wrk_post.lua's
/// `BENCH_DELAY_MS`), send, read the whole answer, record the time between the two.
fn one_connection(host: &str, request: &[u8], started: Instant, deadline: Instant, delay: Duration) -> Run {
    let mut run = Run { latencies_ns: Vec::with_capacity(1 << 20), ..Run::default() };
    let mut conn: Option<Conn> = None;
    while Instant::now() < deadline {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match Conn::open(host) {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    run.errors.connect += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let sent = Instant::now();
        if c.stream.write_all(request).is_err() {
            run.errors.write += 1;
            conn = None;
            continue;
        }
        match c.response() {
            Ok(answer) => {
                run.latencies_ns.push(u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX));
                run.sent_ns.push(u64::try_from((sent - started).as_nanos()).unwrap_or(u64::MAX));
                run.bytes += answer.bytes;
                if !(200..300).contains(&answer.status) {
                    run.errors.status += 1;
                }
                if answer.close {
                    conn = None;
                }
            }
            Err(e) => {
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                    run.errors.timeout += 1;
                } else {
                    run.errors.read += 1;
                }
                conn = None;
            }
        }
    }
    run
}

/// `-d<seconds>s`, `-c<connections>` (each also as two arguments) and the URL.
fn args() -> Result<(f64, usize, String), String> {
    let (mut seconds, mut connections, mut url) = (10.0, 1, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if let Some(d) = a.strip_prefix("-d") {
            let d = if d.is_empty() { it.next().unwrap_or_default() } else { d.to_string() };
            seconds = d.trim_end_matches('s').parse().map_err(|_| format!("bad duration {d:?}"))?;
        } else if let Some(c) = a.strip_prefix("-c") {
            let c = if c.is_empty() { it.next().unwrap_or_default() } else { c.to_string() };
            connections = match c.parse() {
                Ok(n) if (1..=256).contains(&n) => n,
                _ => return Err(format!("bad connection count {c:?} (1 to 256)")),
            };
        } else if a.starts_with("http://") {
            url = Some(a);
        } else {
            return Err(format!(
                "unknown argument {a:?}; usage: tollgate-bench-probe -d10s [-c1] http://HOST:PORT/PATH"
            ));
        }
    }
    Ok((seconds, connections, url.ok_or("no URL given")?))
}

struct Answer {
    status: u16,
    bytes: u64,
    close: bool,
}

/// A kept-alive connection and what was read past the last answer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
}

impl Conn {
    fn open(host: &str) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(host)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Conn { stream, buf: Vec::with_capacity(64 * 1024), start: 0 })
    }

    fn more(&mut self) -> std::io::Result<()> {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + 16 * 1024, 0);
        let n = self.stream.read(&mut self.buf[len..]);
        self.buf.truncate(len + *n.as_ref().unwrap_or(&0));
        match n {
            Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The bytes up to the next CRLF (consumed with it).
    fn line(&mut self) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf[self.start..].windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[self.start..self.start + i].to_vec();
                self.start += i + 2;
                return Ok(line);
            }
            self.more()?;
        }
    }

    fn skip(&mut self, mut n: usize) -> std::io::Result<()> {
        loop {
            let have = (self.buf.len() - self.start).min(n);
            self.start += have;
            n -= have;
            if n == 0 {
                return Ok(());
            }
            self.more()?;
        }
    }

    fn response(&mut self) -> std::io::Result<Answer> {
        let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let status_line = self.line()?;
        let status = std::str::from_utf8(&status_line)
            .ok()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let (mut length, mut chunked, mut close) = (None, false, false);
        let mut bytes = status_line.len() as u64 + 2;
        loop {
            let h = self.line()?;
            bytes += h.len() as u64 + 2;
            if h.is_empty() {
                break;
            }
            let h = String::from_utf8_lossy(&h).to_ascii_lowercase();
            if let Some(v) = h.strip_prefix("content-length:") {
                length = Some(v.trim().parse::<usize>().map_err(|_| bad("bad content-length"))?);
            } else if h.starts_with("transfer-encoding:") && h.contains("chunked") {
                chunked = true;
            } else if h.starts_with("connection:") && h.contains("close") {
                close = true;
            }
        }
        if chunked {
            loop {
                let size_line = self.line()?;
                let text = String::from_utf8_lossy(&size_line);
                let size = usize::from_str_radix(text.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| bad("bad chunk size"))?;
                bytes += size_line.len() as u64 + 2;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line()?.is_empty() {}
                    bytes += 2;
                    break;
                }
                self.skip(size + 2)?;
                bytes += size as u64 + 2;
            }
        } else if let Some(n) = length {
            self.skip(n)?;
            bytes += n as u64;
        } else if !(status == 204 || status == 304 || (100..200).contains(&status)) {
            // Close-delimited: read to the end.
            while self.more().is_ok() {}
            bytes += (self.buf.len() - self.start) as u64;
            self.start = self.buf.len();
            close = true;
        }
        Ok(Answer { status, bytes, close })
    }
}
