//! `--config <file>`: settings in mongod's YAML layout, turned into the flags they stand for.
//!
//! Owns: which YAML keys mean which flag, for the embedded cluster and each subcommand.
//!
//! Invariants: pure (text in, flags out); every key in the file is either understood or
//! refused with an error that names it, never ignored; settings Tributary does not have yet
//! (the rest of `security` but `authorization` and `keyFile`) are refused rather than silently
//! run without. The binary puts these flags before the command line's own, and a flag given on
//! the command line wins.

use serde_norway::Value;

/// The component the file configures: the embedded cluster, `shard` or `router`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Embedded,
    Shard,
    Router,
}

/// One understood key: its dotted path, its flag, and where the flag exists.
struct Setting {
    path: &'static str,
    flag: &'static str,
    kind: Kind,
    on: &'static [Component],
}

#[derive(Clone, Copy)]
enum Kind {
    /// `--flag <value>`.
    Value,
    /// `--flag` when true.
    Switch,
    /// `--flag <item>` per list item.
    List,
}

use Component::{Embedded, Router, Shard};

const ALL: &[Component] = &[Embedded, Shard, Router];
const ROUTERS: &[Component] = &[Embedded, Router];
const STORES: &[Component] = &[Embedded, Shard];

const SETTINGS: &[Setting] = &[
    Setting {
        path: "net.port",
        flag: "--port",
        kind: Kind::Value,
        on: ALL,
    },
    Setting {
        path: "net.bindIp",
        flag: "--bind-ip",
        kind: Kind::Value,
        on: ALL,
    },
    Setting {
        path: "net.maxIncomingConnections",
        flag: "--maxConns",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "storage.dbPath",
        flag: "--dbpath",
        kind: Kind::Value,
        on: STORES,
    },
    Setting {
        path: "storage.oplogMinRetentionHours",
        flag: "--oplogMinRetentionHours",
        kind: Kind::Value,
        on: STORES,
    },
    Setting {
        path: "replication.oplogSizeMB",
        flag: "--oplogSizeMB",
        kind: Kind::Value,
        on: STORES,
    },
    Setting {
        path: "operationProfiling.slowOpThresholdMs",
        flag: "--slowms",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "systemLog.logFormat",
        flag: "--logFormat",
        kind: Kind::Value,
        on: ALL,
    },
    Setting {
        path: "setParameter.enableTestCommands",
        flag: "--enableTestCommands",
        kind: Kind::Switch,
        on: ALL,
    },
    Setting {
        path: "setParameter.maxAcceptableLogicalClockDriftSecs",
        flag: "--maxAcceptableLogicalClockDriftSecs",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "net.tls.mode",
        flag: "--tlsMode",
        kind: Kind::Value,
        on: ALL,
    },
    Setting {
        path: "net.tls.certificateKeyFile",
        flag: "--tlsCertificateKeyFile",
        kind: Kind::Value,
        on: ALL,
    },
    Setting {
        path: "net.tls.CAFile",
        flag: "--tlsCAFile",
        kind: Kind::Value,
        on: ALL,
    },
    Setting {
        path: "net.tls.allowConnectionsWithoutCertificates",
        flag: "--tlsAllowConnectionsWithoutCertificates",
        kind: Kind::Switch,
        on: ALL,
    },
    Setting {
        path: "security.authorization",
        flag: "--auth",
        kind: Kind::Switch,
        on: ROUTERS,
    },
    Setting {
        path: "security.keyFile",
        flag: "--keyFile",
        kind: Kind::Value,
        on: &[Shard, Router],
    },
    Setting {
        path: "tributary.shards",
        flag: "--shards",
        kind: Kind::Value,
        on: &[Embedded],
    },
    Setting {
        path: "tributary.shardHosts",
        flag: "--shard",
        kind: Kind::List,
        on: &[Router],
    },
    Setting {
        path: "tributary.name",
        flag: "--name",
        kind: Kind::Value,
        on: &[Shard],
    },
    Setting {
        path: "replication.replSetName",
        flag: "--replSet",
        kind: Kind::Value,
        on: &[Shard],
    },
    Setting {
        path: "tributary.peers",
        flag: "--peers",
        kind: Kind::List,
        on: &[Shard],
    },
    Setting {
        path: "tributary.replSetMode",
        flag: "--replSetMode",
        kind: Kind::Switch,
        on: ROUTERS,
    },
    Setting {
        path: "tributary.metricsPort",
        flag: "--metricsPort",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "tributary.httpPort",
        flag: "--httpPort",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "tributary.streamRepliesPerSecond",
        flag: "--streamRepliesPerSecond",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "tributary.frameTimeoutMS",
        flag: "--frameTimeoutMS",
        kind: Kind::Value,
        on: ROUTERS,
    },
    Setting {
        path: "tributary.shardConnectTimeoutMS",
        flag: "--shardConnectTimeoutMS",
        kind: Kind::Value,
        on: &[Router],
    },
    Setting {
        path: "tributary.shardOutageTimeoutSecs",
        flag: "--shardOutageTimeoutSecs",
        kind: Kind::Value,
        on: &[Router],
    },
];

/// Keys of mongod's layout that Tributary does not support yet: refused with this reason.
const NOT_YET: &[(&str, &str)] = &[
    (
        "security",
        "only security.authorization and security.keyFile are supported (no LDAP or x.509 yet)",
    ),
    ("net.ssl", "the ssl options are spelled net.tls"),
];

/// The flags a config file stands for, for `component`.
pub fn flags(text: &str, component: Component) -> Result<Vec<String>, String> {
    let root: Value =
        serde_norway::from_str(text).map_err(|e| format!("the config file is not YAML: {e}"))?;
    let mut leaves = Vec::new();
    match &root {
        Value::Mapping(_) => walk(&root, String::new(), &mut leaves)?,
        Value::Null => {}
        _ => return Err("the config file must be a mapping of settings".into()),
    }
    let mut out = Vec::new();
    for (path, value) in leaves {
        let Some(setting) = SETTINGS.iter().find(|s| s.path == path) else {
            if let Some((_, why)) = NOT_YET
                .iter()
                .find(|(k, _)| path == *k || path.starts_with(&format!("{k}.")))
            {
                if is_off(&value) {
                    continue;
                }
                return Err(format!("{path}: {why}"));
            }
            return Err(format!("{path}: not a setting Tributary knows"));
        };
        if !setting.on.contains(&component) {
            return Err(format!("{path}: does not apply to this component"));
        }
        match setting.kind {
            Kind::Value => {
                out.push(setting.flag.to_string());
                out.push(scalar(&path, &value)?);
            }
            Kind::Switch => {
                if truthy(&path, &value)? {
                    out.push(setting.flag.to_string());
                }
            }
            Kind::List => {
                let Value::Sequence(items) = &value else {
                    return Err(format!("{path}: must be a list"));
                };
                for item in items {
                    out.push(setting.flag.to_string());
                    out.push(scalar(&path, item)?);
                }
            }
        }
    }
    Ok(out)
}

/// The leaves of the mapping, by dotted path (a list is a leaf).
fn walk(v: &Value, prefix: String, out: &mut Vec<(String, Value)>) -> Result<(), String> {
    let Value::Mapping(m) = v else {
        out.push((prefix, v.clone()));
        return Ok(());
    };
    for (k, child) in m {
        let Value::String(k) = k else {
            return Err(format!("{prefix}: keys must be strings"));
        };
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        walk(child, path, out)?;
    }
    Ok(())
}

fn scalar(path: &str, v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(format!("{path}: must be a single value")),
    }
}

fn truthy(path: &str, v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => Ok(n.as_f64().is_some_and(|n| n != 0.0)),
        Value::String(s) if matches!(s.as_str(), "true" | "1" | "enabled") => Ok(true),
        Value::String(s) if matches!(s.as_str(), "false" | "0" | "disabled") => Ok(false),
        _ => Err(format!("{path}: must be true or false")),
    }
}

/// `security.authorization: disabled`, `net.tls.mode: disabled` and the like ask for nothing.
fn is_off(v: &Value) -> bool {
    match v {
        Value::String(s) => matches!(s.as_str(), "disabled" | "false"),
        Value::Bool(b) => !b,
        Value::Null => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mongods_layout_becomes_flags() {
        let text = "
net:
  port: 27100
  bindIp: 0.0.0.0
storage:
  dbPath: /var/lib/tributary
operationProfiling:
  slowOpThresholdMs: 50
setParameter:
  enableTestCommands: 1
tributary:
  shards: 2
  metricsPort: 9216
  httpPort: 8080
security:
  authorization: disabled
";
        let got = flags(text, Component::Embedded).expect("flags");
        assert_eq!(
            got,
            [
                "--port",
                "27100",
                "--bind-ip",
                "0.0.0.0",
                "--dbpath",
                "/var/lib/tributary",
                "--slowms",
                "50",
                "--enableTestCommands",
                "--shards",
                "2",
                "--metricsPort",
                "9216",
                "--httpPort",
                "8080"
            ]
        );
    }

    #[test]
    fn tls_settings_become_flags() {
        let text = "net:\n  tls:\n    mode: requireTLS\n    certificateKeyFile: /s.pem\n    CAFile: /ca.pem\n    allowConnectionsWithoutCertificates: true\n";
        assert_eq!(
            flags(text, Component::Shard).expect("flags"),
            [
                "--tlsMode",
                "requireTLS",
                "--tlsCertificateKeyFile",
                "/s.pem",
                "--tlsCAFile",
                "/ca.pem",
                "--tlsAllowConnectionsWithoutCertificates"
            ]
        );
    }

    #[test]
    fn client_limits_become_flags_on_routers_only() {
        let text = "net:\n  maxIncomingConnections: 5000\ntributary:\n  frameTimeoutMS: 10000\n";
        let want = ["--maxConns", "5000", "--frameTimeoutMS", "10000"];
        assert_eq!(flags(text, Component::Embedded).expect("flags"), want);
        assert_eq!(flags(text, Component::Router).expect("flags"), want);
        // A shard's own listener keeps the defaults (see `wire::limits`).
        assert!(
            flags(text, Component::Shard)
                .expect_err("shard")
                .contains("does not apply")
        );
    }

    #[test]
    fn a_router_lists_its_shards() {
        let text = "tributary:\n  shardHosts: [a:1, b:2]\nnet:\n  port: 1\n";
        assert_eq!(
            flags(text, Component::Router).expect("flags"),
            ["--shard", "a:1", "--shard", "b:2", "--port", "1"]
        );
    }

    #[test]
    fn what_is_not_understood_is_refused_by_name() {
        let refused = |text: &str, c: Component| flags(text, c).expect_err(text);
        assert!(
            refused("security:\n  keyFile: /k\n", Component::Embedded).contains("security.keyFile")
        );
        assert!(
            refused("net:\n  ssl:\n    mode: requireSSL\n", Component::Router).contains("net.tls")
        );
        assert!(refused("net:\n  portt: 1\n", Component::Embedded).contains("net.portt"));
        assert!(refused("storage:\n  dbPath: x\n", Component::Router).contains("does not apply"));
        assert!(refused("- a\n- b\n", Component::Embedded).contains("mapping"));
        assert!(refused("net: [\n", Component::Embedded).contains("YAML"));
        assert!(refused("tributary:\n  shardHosts: a\n", Component::Router).contains("list"));
        assert_eq!(flags("", Component::Shard), Ok(vec![]));
        assert_eq!(
            flags("security:\n  authorization: enabled\n", Component::Router),
            Ok(vec!["--auth".to_string()])
        );
        assert!(refused("security:\n  clusterAuthMode: x509\n", Component::Shard).contains("LDAP"));
        assert_eq!(
            flags("security:\n  keyFile: /k\n", Component::Shard),
            Ok(vec!["--keyFile".to_string(), "/k".to_string()])
        );
    }
}
