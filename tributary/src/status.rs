//! `tributary status`: a running cluster's state on the command line. It runs the router's
//! `tributaryStatus` command (what `GET /v1/status` serves) and prints it as tables (shards
//! with their oplog windows and high-water marks, open streams with their lag, subscriptions)
//! or, with `--json`, as the reply itself.
//!
//! Pure apart from [`run`]: the URI's parse and the rendering take values and give text.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use bson::{Bson, Document};

/// How long the whole exchange may take: the router answers within a second per shard.
const PATIENCE: Duration = Duration::from_secs(10);

/// Asks the router at `uri` for its status and prints it.
pub async fn run(
    uri: &str,
    key: Option<std::sync::Arc<wire::keyfile::KeyFile>>,
    json: bool,
) -> anyhow::Result<()> {
    let addr = address_of(uri)?;
    let client = wire::client::Client::new(addr.clone()).with_key(key);
    let cmd = bson::doc! {"tributaryStatus": 1};
    let reply = tokio::time::timeout(PATIENCE, client.command("admin", &cmd))
        .await
        .with_context(|| format!("{addr} did not answer within {PATIENCE:?}"))?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(e) = wire::MongoError::from_reply(&reply) {
        bail!("{addr}: {} ({}, code {})", e.errmsg, e.code_name, e.code);
    }
    let mut reply = reply;
    for gossip in ["ok", "$clusterTime", "operationTime"] {
        reply.remove(gossip);
    }
    let out = if json {
        format!("{:#}\n", Bson::Document(reply).into_relaxed_extjson())
    } else {
        render(&reply)
    };
    // A reader that stops early (`| head`) is not an error.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// The `host:port` of a `mongodb://` URI (its first host; 27017 when it names no port). A URI
/// with a user and password is refused: this tool logs in with `--keyFile` only.
pub fn address_of(uri: &str) -> anyhow::Result<String> {
    let Some(rest) = uri.strip_prefix("mongodb://") else {
        bail!("expected a mongodb:// URI, got {uri:?}");
    };
    let hosts = rest.split(['/', '?']).next().unwrap_or("");
    if hosts.contains('@') {
        bail!("tributary status logs in with --keyFile only, not a user and password in the URI");
    }
    let host = hosts.split(',').next().unwrap_or("");
    if host.is_empty() {
        bail!("the URI {uri:?} names no host");
    }
    // `[::1]:27017`, `[::1]`, `host:27017`, `host`.
    let has_port = match host.rfind(']') {
        Some(end) => host[end..].contains(':'),
        None => host.contains(':'),
    };
    Ok(if has_port {
        host.to_string()
    } else {
        format!("{host}:27017")
    })
}

/// The status as tables.
pub fn render(status: &Document) -> String {
    let empty = Document::new();
    let doc = |d: &Document, k: &str| d.get_document(k).cloned().unwrap_or_default();
    let router = doc(status, "router");
    let mut out = format!(
        "router {}  up {}  cluster time {}  {} connections  {} cursors\n\n",
        text(&router, "host"),
        duration(number(&router, "uptimeSecs")),
        time(router.get_document("clusterTime").unwrap_or(&empty)),
        number(&router, "connections"),
        number(&router, "cursors"),
    );
    let shards = documents(status, "shards");
    let mut rows = vec![row([
        "SHARD",
        "UP",
        "OLDEST ENTRY",
        "NEWEST ENTRY",
        "ENTRIES",
        "SIZE",
        "HIGH-WATER MARK",
    ])];
    for s in &shards {
        let up = s.get_bool("up").unwrap_or(false);
        let oplog = doc(s, "oplog");
        let at = |k: &str| oplog.get_document(k).map_or("-".to_string(), time);
        rows.push(vec![
            text(s, "name"),
            if up { "yes" } else { "no" }.to_string(),
            if up { at("earliest") } else { "-".into() },
            if up { at("current") } else { "-".into() },
            if up {
                thousands(number(&oplog, "entries"))
            } else {
                "-".into()
            },
            if up {
                bytes(number(&oplog, "bytes"))
            } else {
                "-".into()
            },
            s.get_document("highWaterMark")
                .map_or("-".to_string(), time),
        ]);
    }
    out.push_str(&table(&rows));
    let streams = doc(status, "streams");
    out.push_str(&format!(
        "\n{} change streams open, {} shared merges, most lag {}, {} events delivered\n",
        number(&streams, "open"),
        number(&streams, "sharedMerges"),
        duration(number(&streams, "maxLagSecs")),
        thousands(number(&streams, "eventsDelivered")),
    ));
    let list = documents(&streams, "list");
    if !list.is_empty() {
        let mut rows = vec![row(["CURSOR", "NAMESPACE", "LAG"])];
        rows.extend(list.iter().map(|c| {
            vec![
                text(c, "cursorId"),
                text(c, "ns"),
                duration(number(c, "lagSecs")),
            ]
        }));
        out.push_str(&table(&rows));
    }
    let subscriptions = documents(status, "subscriptions");
    out.push_str(&format!("\n{} subscriptions\n", subscriptions.len()));
    if !subscriptions.is_empty() {
        let mut rows = vec![row(["DATABASE", "NAME", "CONSUMERS"])];
        rows.extend(subscriptions.iter().map(|s| {
            vec![
                text(s, "db"),
                text(s, "name"),
                thousands(number(s, "consumers")),
            ]
        }));
        out.push_str(&table(&rows));
    }
    out
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Rows as columns padded to their widest cell, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn documents(d: &Document, k: &str) -> Vec<Document> {
    d.get_array(k)
        .map(|a| a.iter().filter_map(|v| v.as_document().cloned()).collect())
        .unwrap_or_default()
}

fn text(d: &Document, k: &str) -> String {
    match d.get(k) {
        Some(Bson::String(s)) => s.clone(),
        Some(Bson::Null) | None => "-".into(),
        Some(v) => v.to_string(),
    }
}

fn number(d: &Document, k: &str) -> f64 {
    match d.get(k) {
        Some(Bson::Double(x)) => *x,
        Some(Bson::Int32(x)) => f64::from(*x),
        Some(Bson::Int64(x)) => *x as f64,
        _ => 0.0,
    }
}

/// A cluster time `{t, i}` as its UTC wall time and increment.
fn time(t: &Document) -> String {
    let secs = number(t, "t") as i64;
    format!("{} #{}", utc(secs), number(t, "i") as u64)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
fn utc(secs: i64) -> String {
    let at = bson::DateTime::from_millis(secs.saturating_mul(1000));
    match at.try_to_rfc3339_string() {
        // `2026-12-07T21:00:00Z`
        Ok(text) => text.replacen('T', " ", 1).trim_end_matches('Z').to_string(),
        Err(_) => format!("{secs} s"),
    }
}

fn duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

fn thousands(n: f64) -> String {
    let digits = (n.max(0.0) as u64).to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut size = n.max(0.0);
    let mut unit = 0;
    while size >= 1024.0 && unit + 1 < UNITS.len() {
        size /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{size:.0} B")
    } else {
        format!("{size:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    #[test]
    fn the_address_is_the_uris_first_host() {
        assert_eq!(address_of("mongodb://h:1/?x=1").unwrap(), "h:1");
        assert_eq!(address_of("mongodb://h").unwrap(), "h:27017");
        assert_eq!(address_of("mongodb://a:1,b:2/db").unwrap(), "a:1");
        assert_eq!(address_of("mongodb://[::1]").unwrap(), "[::1]:27017");
        assert_eq!(address_of("mongodb://[::1]:9").unwrap(), "[::1]:9");
        assert!(address_of("mongodb://u:p@h:1").is_err());
        assert!(address_of("http://h:1").is_err());
        assert!(address_of("mongodb:///db").is_err());
    }

    #[test]
    fn times_sizes_and_counts_read_as_people_write_them() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_796_677_200), "2026-12-07 21:00:00");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(3.5 * 1024.0 * 1024.0), "3.5 MiB");
        assert_eq!(duration(61.0), "1m01s");
        assert_eq!(duration(7_380.0), "2h03m");
    }

    #[test]
    fn the_tables_show_each_shard_and_stream() {
        let status = doc! {
            "router": {"host": "r1", "uptimeSecs": 75.0, "clusterTime": {"t": 0, "i": 3},
                       "connections": 2, "cursors": 1},
            "shards": [
                {"name": "shard0", "up": true,
                 "oplog": {"earliest": {"t": 0, "i": 1}, "current": {"t": 60, "i": 2},
                           "bytes": 2048, "entries": 1500},
                 "highWaterMark": {"t": 60, "i": 2}},
                {"name": "shard1", "up": false, "oplog": null, "highWaterMark": null},
            ],
            "streams": {"open": 1, "sharedMerges": 1, "maxLagSecs": 3.0, "eventsDelivered": 12,
                        "list": [{"cursorId": "77", "ns": "db.c", "lagSecs": 3.0}]},
            "subscriptions": [],
        };
        let text = render(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("router r1  up 1m15s"), "{text}");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("shard0  yes  1970-01-01 00:00:00 #1")
                    && l.contains("1,500")
                    && l.contains("2.0 KiB")),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["shard1", "no", "-", "-", "-", "-", "-"]),
            "{text}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("77      db.c")),
            "{text}"
        );
        assert!(text.contains("0 subscriptions"), "{text}");
    }
}
