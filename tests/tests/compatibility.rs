//! The compatibility table against MongoDB 7.0 (`docs/src/compatibility.md`), generated from
//! what a running cluster does: every name of MongoDB 7.0's commands, query, projection and
//! update operators, aggregation stages, expression operators, accumulators and window
//! operators (`tests/compat/mongodb-7.0.toml`) is tried through the Rust driver, and is
//! supported unless the server refuses it as unknown or unsupported; a supported name with a
//! note in `tests/compat/partial.toml` is partial, the note saying how. The test fails when the
//! page in the repository is not the page generated, and writes the generated one when
//! `TRIBUTARY_UPDATE_DOCS=1`.
//!
//! Invariants: the verdict of a name is the server's answer to a use of it, never a list kept
//! by hand; a note on a name the server refuses fails the test (the note would be stale).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use bson::{Document, doc};
use mongodb::error::ErrorKind;
use mongodb::{Client, Database};
use tests::EmbeddedCluster;

/// How MongoDB 7.0's names are grouped, in the page's order: the key in the lists' file, the
/// page's heading and the column's name.
const CATEGORIES: &[(&str, &str, &str)] = &[
    ("commands", "Commands", "Command"),
    (
        "query_operators",
        "Query and projection operators",
        "Operator",
    ),
    ("update_operators", "Update operators", "Operator"),
    ("aggregation_stages", "Aggregation stages", "Stage"),
    ("expression_operators", "Expression operators", "Operator"),
    ("accumulators", "Accumulators (`$group`)", "Accumulator"),
    (
        "window_operators",
        "Window operators (`$setWindowFields`)",
        "Operator",
    ),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Supported,
    Partial(String),
    NotSupported,
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The `[table]`s of a TOML file as name → array of strings or name → string.
fn read_toml(path: &str) -> Result<toml::Table> {
    let text = std::fs::read_to_string(workspace().join(path)).with_context(|| path.to_string())?;
    Ok(text.parse::<toml::Table>()?)
}

fn strings(table: &toml::Table, key: &str) -> Vec<String> {
    table
        .get(key)
        .and_then(toml::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The reason a use of a name failed as "this server does not know or do this", or `None`
/// when it succeeded or failed for another reason (a bad argument to a known name). A write's
/// error comes in the reply's `writeErrors`.
fn refusal(result: mongodb::error::Result<Document>) -> Option<String> {
    let (code, message) = match result {
        Ok(reply) => {
            let error = reply
                .get_array("writeErrors")
                .ok()?
                .first()?
                .as_document()?;
            (
                error.get_i32("code").unwrap_or(0),
                error.get_str("errmsg").unwrap_or("").to_string(),
            )
        }
        Err(e) => match *e.kind {
            ErrorKind::Command(ref c) => (c.code, c.message.clone()),
            _ => return None,
        },
    };
    let unknown = [
        "Unrecognized",
        "unknown operator",
        "unknown top level operator",
        "Unknown modifier",
        "unknown group operator",
        "not supported by this server",
        "no such command",
    ];
    // 59 CommandNotFound, 115 CommandNotSupported, 168 InvalidPipelineOperator,
    // 40324 an unknown stage, 15952 an unknown accumulator; 31264 and 6108304, server-side
    // JavaScript, which the server runs without (as a mongod with `--noscripting`).
    (matches!(code, 59 | 115 | 168 | 40324 | 15952 | 31264 | 6108304)
        || unknown.iter().any(|u| message.contains(u)))
    .then(|| format!("{code}: {message}"))
}

/// The document every probe reads and updates (put back before each update).
fn sample() -> Document {
    doc! {"_id": 1, "a": [1, 2], "n": 1, "s": "x"}
}

/// Tries one name of a category (not a command) against the cluster: `None` when supported.
async fn probe(db: &Database, category: &str, name: &str) -> Option<String> {
    let aggregate = |pipeline: Vec<Document>| async move {
        db.run_command(doc! {"aggregate": "c", "pipeline": pipeline, "cursor": {}})
            .await
    };
    let find = |filter: Document, projection: Document| async move {
        db.run_command(doc! {"find": "c", "filter": filter, "projection": projection})
            .await
    };
    let update = |update: Document, filter: Document, options: Document| async move {
        let reset = doc! {"q": {"_id": 1}, "u": sample()};
        db.run_command(doc! {"update": "c", "updates": [reset]})
            .await?;
        let mut statement = doc! {"q": filter, "u": update};
        statement.extend(options);
        db.run_command(doc! {"update": "c", "updates": [statement]})
            .await
    };
    let any = doc! {};
    match category {
        "query_operators" => refusal(match name {
            // Projection operators.
            "$" => find(doc! {"a": 1}, doc! {"a.$": 1}).await,
            // Text search, with the text index it needs in place: an index still not
            // found is text search refused.
            "$text" | "$meta" => {
                let index = doc! {"key": {"s": "text"}, "name": "s_text"};
                if let Err(e) = db
                    .run_command(doc! {"createIndexes": "c", "indexes": [index]})
                    .await
                {
                    return Some(format!("creating a text index: {e}"));
                }
                let projection = if name == "$meta" {
                    doc! {"score": {"$meta": "textScore"}}
                } else {
                    doc! {}
                };
                let searched = find(doc! {"$text": {"$search": "x"}}, projection).await;
                return match searched {
                    Err(e) if matches!(*e.kind, ErrorKind::Command(ref c) if c.code == 27) => {
                        Some(format!("with a text index: {e}"))
                    }
                    other => refusal(other),
                };
            }
            "$slice" => find(any, doc! {"a": {"$slice": 1}}).await,
            // Top-level operators.
            "$and" | "$or" | "$nor" => find(doc! {name: [{"a": 1}]}, any).await,
            "$expr" => find(doc! {"$expr": true}, any).await,
            "$jsonSchema" => find(doc! {"$jsonSchema": {}}, any).await,
            "$where" => find(doc! {"$where": "true"}, any).await,
            "$comment" => find(doc! {"$comment": "x"}, any).await,
            // Shapes of `$geoWithin`, and bounds of `$near`.
            "$box" | "$center" | "$centerSphere" | "$polygon" | "$geometry" => {
                find(doc! {"a": {"$geoWithin": {name: [[0, 0], [1, 1]]}}}, any).await
            }
            "$maxDistance" | "$minDistance" => {
                find(doc! {"a": {"$near": [0, 0], name: 1}}, any).await
            }
            _ => find(doc! {"a": {name: []}}, any).await,
        }),
        "update_operators" => refusal(match name {
            "$" => update(doc! {"$set": {"a.$": 1}}, doc! {"a": 1}, any).await,
            "$[]" => update(doc! {"$set": {"a.$[]": 1}}, any.clone(), any).await,
            "$[<identifier>]" => {
                let filters = doc! {"arrayFilters": [{"x": 1}]};
                update(doc! {"$set": {"a.$[x]": 1}}, any, filters).await
            }
            "$each" | "$position" | "$slice" | "$sort" => {
                let mut modifier = doc! {"$each": [1]};
                if name != "$each" {
                    modifier.insert(name, if name == "$sort" { 1 } else { 0 });
                }
                update(doc! {"$push": {"a": modifier}}, any.clone(), any).await
            }
            "$bit" => update(doc! {"$bit": {"n": {"and": 1}}}, any.clone(), any).await,
            "$currentDate" => update(doc! {name: {"d": true}}, any.clone(), any).await,
            "$rename" => update(doc! {name: {"n": "m"}}, any.clone(), any).await,
            "$unset" => update(doc! {name: {"z": ""}}, any.clone(), any).await,
            "$pullAll" => update(doc! {name: {"a": [1]}}, any.clone(), any).await,
            _ => {
                let field = if matches!(name, "$addToSet" | "$push" | "$pull" | "$pop") {
                    "a"
                } else {
                    "n"
                };
                update(doc! {name: {field: 1}}, any.clone(), any).await
            }
        }),
        // A stage of change streams only: after `$changeStream`.
        "aggregation_stages" if name == "$changeStreamSplitLargeEvent" => {
            refusal(aggregate(vec![doc! {"$changeStream": {}}, doc! {name: {}}]).await)
        }
        "aggregation_stages" => refusal(aggregate(vec![doc! {name: {}}]).await),
        "expression_operators" => {
            refusal(aggregate(vec![doc! {"$project": {"v": {name: []}}}]).await)
        }
        "accumulators" => {
            refusal(aggregate(vec![doc! {"$group": {"_id": null, "v": {name: "$n"}}}]).await)
        }
        "window_operators" => refusal(
            aggregate(vec![doc! {"$setWindowFields": {
                "sortBy": {"n": 1},
                "output": {"v": {name: {}}},
            }}])
            .await,
        ),
        other => Some(format!("no way to try a {other}")),
    }
}

/// The verdict of every name of every category.
async fn verdicts(
    client: &Client,
    names: &toml::Table,
    notes: &toml::Table,
) -> Result<BTreeMap<&'static str, Vec<(String, Verdict)>>> {
    let db = client.database("compatibility");
    db.collection::<Document>("c").insert_one(sample()).await?;
    let listed: Vec<String> = client
        .database("admin")
        .run_command(doc! {"listCommands": 1})
        .await?
        .get_document("commands")?
        .keys()
        .cloned()
        .collect();
    let mut out = BTreeMap::new();
    let mut stale = Vec::new();
    for (category, _, _) in CATEGORIES {
        let category_notes = notes.get(*category).and_then(toml::Value::as_table);
        let mut rows = Vec::new();
        for name in strings(names, category) {
            let refused = if *category == "commands" {
                (!listed.contains(&name)).then(|| "not in listCommands".to_string())
            } else {
                probe(&db, category, &name).await
            };
            let note = category_notes
                .and_then(|n| n.get(&name))
                .and_then(toml::Value::as_str);
            let verdict = match (refused, note) {
                (None, None) => Verdict::Supported,
                (None, Some(note)) => Verdict::Partial(note.to_string()),
                (Some(_), None) => Verdict::NotSupported,
                (Some(why), Some(_)) => {
                    stale.push(format!(
                        "{category} {name}: noted partial, but refused ({why})"
                    ));
                    Verdict::NotSupported
                }
            };
            rows.push((name, verdict));
        }
        out.insert(*category, rows);
    }
    // Tributary's own commands: listed, not MongoDB's.
    let mongodb_commands = strings(names, "commands");
    let own: Vec<(String, Verdict)> = listed
        .iter()
        .filter(|c| !mongodb_commands.contains(c))
        .map(|c| (c.clone(), Verdict::Supported))
        .collect();
    out.insert("own_commands", own);
    db.drop().await?;
    anyhow::ensure!(stale.is_empty(), "stale notes:\n{}", stale.join("\n"));
    Ok(out)
}

fn render(verdicts: &BTreeMap<&'static str, Vec<(String, Verdict)>>) -> String {
    let mut page = String::from(
        "<!-- generated by tests/tests/compatibility.rs: do not edit -->\n\
         # Compatibility with MongoDB 7.0\n\n\
         Every command, query, projection and update operator, aggregation stage, expression \
         operator, accumulator and window operator of MongoDB 7.0, as a running Tributary \
         cluster answers a use of it: **supported**, **partial** (with how), or **not \
         supported** (the server refuses it as unknown or unsupported). The page is generated \
         by `tests/tests/compatibility.rs` from the server's own answers, and CI fails when the \
         page and the server disagree; regenerate it with \
         `TRIBUTARY_UPDATE_DOCS=1 cargo nextest run -p tests --test compatibility`.\n\n\
         | | supported | partial | not supported |\n|---|---|---|---|\n",
    );
    let count = |rows: &[(String, Verdict)], f: fn(&Verdict) -> bool| {
        rows.iter().filter(|(_, v)| f(v)).count()
    };
    for (key, heading, _) in CATEGORIES {
        let rows = &verdicts[key];
        page.push_str(&format!(
            "| {heading} | {} | {} | {} |\n",
            count(rows, |v| *v == Verdict::Supported),
            count(rows, |v| matches!(v, Verdict::Partial(_))),
            count(rows, |v| *v == Verdict::NotSupported),
        ));
    }
    for (key, heading, column) in CATEGORIES {
        page.push_str(&format!("\n## {heading}\n\n| {column} | |\n|---|---|\n"));
        for (name, verdict) in &verdicts[key] {
            let status = match verdict {
                Verdict::Supported => "supported".to_string(),
                Verdict::Partial(how) => format!("partial: {how}"),
                Verdict::NotSupported => "not supported".to_string(),
            };
            page.push_str(&format!("| `{name}` | {status} |\n"));
        }
    }
    page.push_str(
        "\n## Tributary's own commands\n\n\
         Commands MongoDB 7.0 does not have (subscriptions, the HTTP feeds' commands, the \
         status):\n\n",
    );
    let own: Vec<String> = verdicts["own_commands"]
        .iter()
        .map(|(name, _)| format!("`{name}`"))
        .collect();
    page.push_str(&own.join(", "));
    page.push('\n');
    page
}

#[tokio::test]
async fn the_compatibility_page_is_what_the_server_answers() -> Result<()> {
    let names = read_toml("tests/compat/mongodb-7.0.toml")?;
    let notes = read_toml("tests/compat/partial.toml")?;
    let cluster = EmbeddedCluster::start(2).await?;
    let client = cluster.client().await?;
    let page = render(&verdicts(&client, &names, &notes).await?);
    let path = workspace().join("docs/src/compatibility.md");
    if std::env::var("TRIBUTARY_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &page)?;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "docs/src/compatibility.md is not what the server answers; regenerate it with \
         TRIBUTARY_UPDATE_DOCS=1 cargo nextest run -p tests --test compatibility"
    );
    Ok(())
}
