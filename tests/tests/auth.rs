//! `--auth` with the `mongodb` driver: the localhost exception for the first user, SCRAM-SHA-256
//! and SCRAM-SHA-1 logins (speculative and not), a wrong password, the user commands, and
//! garbage in every SASL step.

use std::net::SocketAddr;

use futures::TryStreamExt;
use mongodb::bson::{Binary, Bson, Document, doc, spec::BinarySubtype};
use tests::Proc;

async fn server(dir: &std::path::Path) -> anyhow::Result<Proc> {
    let port = tests::free_port()?;
    let args = vec![
        "--port".to_string(),
        port.to_string(),
        "--dbpath".into(),
        dir.join("data").display().to_string(),
        "--auth".into(),
    ];
    Proc::spawn(args, SocketAddr::from(([127, 0, 0, 1], port))).await
}

use tests::{connect_uri as client, direct_uri as uri};

/// A server with `--auth` whose first user, `boss`, has `root`; and a client logged in as it.
async fn with_root_user(dir: &std::path::Path) -> anyhow::Result<(Proc, mongodb::Client)> {
    let p = server(dir).await?;
    let first = client(&uri(p.addr, "", "")).await?;
    first
        .database("admin")
        .run_command(doc! {"createUser": "boss", "pwd": "pw", "roles": ["root"]})
        .await?;
    let boss = client(&uri(p.addr, "boss:pw@", "")).await?;
    Ok((p, boss))
}

fn code(e: &mongodb::error::Error) -> Option<i32> {
    tests::scenarios::code_of(e)
}

/// The actions a list of privileges grants on the whole `app` database.
/// The first role a `rolesInfo` reply lists.
fn first_role(info: &Document) -> anyhow::Result<Document> {
    info.get_array("roles")?
        .first()
        .and_then(|r| r.as_document())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no role in {info}"))
}

fn actions_on_app(privileges: &[mongodb::bson::Bson]) -> Vec<&str> {
    privileges
        .iter()
        .filter_map(|p| p.as_document())
        .find(|p| {
            p.get_document("resource")
                .is_ok_and(|r| *r == doc! {"db": "app", "collection": ""})
        })
        .and_then(|p| p.get_array("actions").ok())
        .map(|a| a.iter().filter_map(|a| a.as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_log_in_with_scram_and_nobody_else_gets_in() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = server(dir.path()).await?;
    let anonymous = client(&uri(p.addr, "", "")).await?;
    let admin_db = anonymous.database("admin");

    // Before any user: nothing but the first createUser, over loopback.
    let e = anonymous
        .database("app")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .expect_err("unauthenticated");
    assert_eq!(code(&e), Some(13), "{e}");
    admin_db
        .run_command(doc! {"createUser": "boss", "pwd": "s3cret", "roles": ["root"]})
        .await?;
    let e = admin_db
        .run_command(doc! {"createUser": "sneaky", "pwd": "x", "roles": ["root"]})
        .await
        .expect_err("the exception is used up");
    assert_eq!(code(&e), Some(13));

    // SCRAM-SHA-256 (the drivers' default, speculative in the handshake) and SCRAM-SHA-1.
    for options in [
        "",
        "&authMechanism=SCRAM-SHA-256",
        "&authMechanism=SCRAM-SHA-1",
    ] {
        let boss = client(&uri(p.addr, "boss:s3cret@", options)).await?;
        let c = boss.database("app").collection::<Document>("c");
        c.insert_one(doc! {"by": options}).await?;
        let status = boss
            .database("admin")
            .run_command(doc! {"connectionStatus": 1})
            .await?;
        let users = status
            .get_document("authInfo")?
            .get_array("authenticatedUsers")?;
        assert_eq!(users.len(), 1, "{status}");
    }
    let boss = client(&uri(p.addr, "boss:s3cret@", "")).await?;
    let mut stream = boss
        .database("app")
        .collection::<Document>("c")
        .watch()
        .await?;
    boss.database("app")
        .collection::<Document>("c")
        .insert_one(doc! {"x": 1})
        .await?;
    assert!(
        stream.try_next().await?.is_some(),
        "an authenticated watch works"
    );

    // A wrong password, and an unknown user.
    for credentials in ["boss:wrong@", "nobody:s3cret@"] {
        let bad = client(&uri(p.addr, credentials, "")).await?;
        let e = bad
            .database("app")
            .collection::<Document>("c")
            .find_one(doc! {})
            .await
            .expect_err("refused");
        assert!(
            matches!(*e.kind, mongodb::error::ErrorKind::Authentication { .. })
                || code(&e) == Some(18),
            "{credentials}: {e}"
        );
    }

    // Users of another database, their roles, and dropping them.
    let app = boss.database("app");
    app.run_command(doc! {"createUser": "web", "pwd": "pw", "roles": ["readWrite"]})
        .await?;
    let e = app
        .run_command(doc! {"createUser": "web", "pwd": "pw", "roles": []})
        .await
        .expect_err("exists");
    assert_eq!(code(&e), Some(51003));
    let e = app
        .run_command(doc! {"createUser": "x", "pwd": "pw", "roles": ["root"]})
        .await
        .expect_err("root is an admin role");
    assert_eq!(code(&e), Some(31));
    app.run_command(doc! {"grantRolesToUser": "web", "roles": ["dbAdmin"]})
        .await?;
    let info = app.run_command(doc! {"usersInfo": "web"}).await?;
    let user = info.get_array("users")?[0]
        .as_document()
        .cloned()
        .unwrap_or_default();
    assert_eq!(user.get_str("db")?, "app");
    assert_eq!(user.get_array("roles")?.len(), 2, "{user}");
    assert!(
        !user.contains_key("credentials"),
        "no credentials unless asked"
    );
    assert_eq!(user.get_array("mechanisms")?.len(), 2);
    let web = client(&uri(p.addr, "web:pw@", "&authSource=app")).await?;
    web.database("app")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await?;
    app.run_command(doc! {"updateUser": "web", "pwd": "new"})
        .await?;
    let fresh = client(&uri(p.addr, "web:new@", "&authSource=app")).await?;
    fresh.database("app").run_command(doc! {"ping": 1}).await?;
    app.run_command(doc! {"dropUser": "web"}).await?;
    let e = app
        .run_command(doc! {"dropUser": "web"})
        .await
        .expect_err("gone");
    assert_eq!(code(&e), Some(11));
    let gone = client(&uri(p.addr, "web:new@", "&authSource=app")).await?;
    assert!(
        gone.database("app")
            .run_command(doc! {"ping": 1})
            .await
            .is_err()
    );
    Ok(())
}

/// Garbage in every SASL step is a clear error, and the connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_sasl_is_refused_cleanly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = server(dir.path()).await?;
    let raw = wire::client::Client::new(p.addr.to_string());
    let bytes = |b: &[u8]| Binary {
        subtype: BinarySubtype::Generic,
        bytes: b.to_vec(),
    };
    let code_of = |d: &Document| d.get_i32("code").ok();
    let unknown = raw
        .command(
            "admin",
            &doc! {"saslStart": 1, "mechanism": "PLAIN", "payload": bytes(b"x")},
        )
        .await?;
    assert_eq!(code_of(&unknown), Some(334), "{unknown}");
    for payload in [&b""[..], b"garbage", b"p=tls,,n=a,r=b", b"\xff\xfe"] {
        let r = raw
            .command(
                "admin",
                &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bytes(payload)},
            )
            .await?;
        assert_eq!(code_of(&r), Some(18), "{payload:?}: {r}");
    }
    let r = raw
        .command(
            "admin",
            &doc! {"saslContinue": 1, "conversationId": 42, "payload": bytes(b"c=biws")},
        )
        .await?;
    assert_eq!(code_of(&r), Some(17), "{r}");
    let r = raw
        .command("admin", &doc! {"saslContinue": 1, "payload": bytes(b"x")})
        .await?;
    assert_eq!(code_of(&r), Some(9), "{r}");
    // A real start for a user that exists, then a forged proof.
    raw.command(
        "admin",
        &doc! {"createUser": "u", "pwd": "p", "roles": ["root"]},
    )
    .await?;
    let started = raw
        .command(
            "admin",
            &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bytes(b"n,,n=u,r=abcdefgh")},
        )
        .await?;
    let id = started.get_i32("conversationId")?;
    let server_first = String::from_utf8(started.get_binary_generic("payload")?.clone())?;
    let nonce = server_first
        .split(',')
        .find_map(|p| p.strip_prefix("r="))
        .unwrap_or("");
    let forged = format!("c=biws,r={nonce},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
    let r = raw
        .command(
            "admin",
            &doc! {"saslContinue": 1, "conversationId": id, "payload": bytes(forged.as_bytes())},
        )
        .await?;
    assert_eq!(code_of(&r), Some(18), "{r}");
    let r = raw
        .command(
            "admin",
            &doc! {"saslContinue": 1, "conversationId": id, "payload": bytes(forged.as_bytes())},
        )
        .await?;
    assert_eq!(code_of(&r), Some(17), "a failed conversation is over: {r}");
    // A replayed final message: a whole good conversation recorded, then its proof sent in
    // a new conversation with the same client nonce. The server's nonce differs: refused.
    let mech = wire::scram::Mechanism::Sha256;
    let cache = wire::scram::SaltedCache::default();
    let (mut client, first) = wire::scram::ClientConversation::start(mech, "u", "p", "replayme")
        .map_err(|e| anyhow::anyhow!(e.0))?;
    let started = raw
        .command(
            "admin",
            &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bytes(&first)},
        )
        .await?;
    let proof = client
        .respond(started.get_binary_generic("payload")?, &cache)
        .map_err(|e| anyhow::anyhow!(e.0))?;
    let id = started.get_i32("conversationId")?;
    let done = raw
        .command(
            "admin",
            &doc! {"saslContinue": 1, "conversationId": id, "payload": bytes(&proof)},
        )
        .await?;
    client
        .verify(done.get_binary_generic("payload")?)
        .map_err(|e| anyhow::anyhow!(e.0))?;
    let again = raw
        .command(
            "admin",
            &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bytes(&first)},
        )
        .await?;
    let r = raw
        .command(
            "admin",
            &doc! {"saslContinue": 1, "conversationId": again.get_i32("conversationId")?, "payload": bytes(&proof)},
        )
        .await?;
    assert_eq!(code_of(&r), Some(18), "a replayed proof: {r}");
    raw.command("admin", &doc! {"logout": 1}).await?;
    let ping = raw.command("admin", &doc! {"ping": 1}).await?;
    assert_eq!(
        ping.get_f64("ok").ok(),
        Some(1.0),
        "the connection still works"
    );
    let find = raw.command("admin", &doc! {"find": "c"}).await?;
    assert_eq!(code_of(&find), Some(13), "and is still not logged in");
    Ok(())
}

/// A connection holds one SASL conversation at a time, as in MongoDB: a client that starts
/// conversations and never finishes them costs one pending conversation, not one per start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_conversations_are_one_per_connection() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = server(dir.path()).await?;
    let raw = wire::client::Client::new(p.addr.to_string());
    raw.command(
        "admin",
        &doc! {"createUser": "u", "pwd": "p", "roles": ["root"]},
    )
    .await?;
    let start = |nonce: &str| {
        doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": Binary {
            subtype: BinarySubtype::Generic,
            bytes: format!("n,,n=u,r={nonce}").into_bytes(),
        }}
    };
    let first = raw.command("admin", &start("first-nonce")).await?;
    let first_id = first.get_i32("conversationId")?;
    for i in 0..200 {
        raw.command("admin", &start(&format!("abandoned-{i}")))
            .await?;
    }
    let continued = raw
        .command(
            "admin",
            &doc! {"saslContinue": 1, "conversationId": first_id, "payload": Binary {
                subtype: BinarySubtype::Generic,
                bytes: b"c=biws,r=first-nonce,p=AAAA".to_vec(),
            }},
        )
        .await?;
    assert_eq!(
        continued.get_i32("code").ok(),
        Some(17),
        "a later start ended the first conversation: {continued}"
    );
    Ok(())
}

/// Each role allows what MongoDB's does and refuses the rest, on CRUD and on `watch()` at
/// collection, database and cluster level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_allow_and_refuse_as_mongodb_does() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (p, boss) = with_root_user(dir.path()).await?;
    let admin = boss.database("admin");
    for (user, roles) in [
        ("reader", vec![doc! {"role": "read", "db": "app"}]),
        ("writer", vec![doc! {"role": "readWrite", "db": "app"}]),
        (
            "monitor",
            vec![doc! {"role": "clusterMonitor", "db": "admin"}],
        ),
        (
            "everyreader",
            vec![doc! {"role": "readAnyDatabase", "db": "admin"}],
        ),
    ] {
        admin
            .run_command(doc! {"createUser": user, "pwd": "pw", "roles": roles})
            .await?;
    }
    boss.database("app")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 0})
        .await?;
    boss.database("other")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 0})
        .await?;
    let login = |user: &str| uri(p.addr, &format!("{user}:pw@"), "");
    let refused = |r: Result<(), mongodb::error::Error>| match r {
        Ok(()) => false,
        Err(e) => code(&e) == Some(13),
    };

    let reader = client(&login("reader")).await?;
    let app = reader.database("app").collection::<Document>("c");
    assert!(app.find_one(doc! {}).await?.is_some());
    let _ = app.watch().await?;
    let _ = reader.database("app").watch().await?;
    assert!(
        refused(app.insert_one(doc! {}).await.map(|_| ())),
        "read cannot write"
    );
    assert!(refused(
        reader
            .database("other")
            .collection::<Document>("c")
            .find_one(doc! {})
            .await
            .map(|_| ())
    ));
    assert!(refused(reader.database("other").watch().await.map(|_| ())));
    assert!(
        refused(reader.watch().await.map(|_| ())),
        "nor watch the cluster"
    );
    assert!(refused(
        reader
            .database("admin")
            .run_command(doc! {"serverStatus": 1})
            .await
            .map(|_| ())
    ));

    let writer = client(&login("writer")).await?;
    let app = writer.database("app").collection::<Document>("c");
    app.insert_one(doc! {"_id": 1}).await?;
    app.update_one(doc! {"_id": 1}, doc! {"$set": {"x": 1}})
        .await?;
    app.delete_one(doc! {"_id": 1}).await?;
    assert!(refused(
        writer
            .database("app")
            .run_command(doc! {"createUser": "x", "pwd": "y", "roles": []})
            .await
            .map(|_| ())
    ));
    assert!(refused(
        writer
            .database("app")
            .run_command(doc! {"collMod": "c"})
            .await
            .map(|_| ())
    ));

    let monitor = client(&login("monitor")).await?;
    monitor
        .database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await?;
    assert!(refused(
        monitor
            .database("app")
            .collection::<Document>("c")
            .find_one(doc! {})
            .await
            .map(|_| ())
    ));

    let everyreader = client(&login("everyreader")).await?;
    let mut cluster = everyreader.watch().await?;
    everyreader
        .database("other")
        .collection::<Document>("c")
        .find_one(doc! {})
        .await?;
    assert!(refused(
        everyreader
            .database("other")
            .collection::<Document>("c")
            .insert_one(doc! {})
            .await
            .map(|_| ())
    ));
    boss.database("other")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 9})
        .await?;
    assert!(
        cluster.try_next().await?.is_some(),
        "the cluster-wide watch sees it"
    );

    // listDatabases: a user without the listDatabases action sees the databases it has a
    // role on, and may not ask for all; a cluster-wide reader or monitor sees every one; and
    // connectionStatus shows each user's own roles.
    let names = |reply: Document| -> Vec<String> {
        reply
            .get_array("databases")
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_document()?.get_str("name").ok().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let listed = names(
        reader
            .database("admin")
            .run_command(doc! {"listDatabases": 1, "nameOnly": true})
            .await?,
    );
    assert_eq!(listed, ["app"], "only where it may read");
    assert!(refused(
        reader
            .database("admin")
            .run_command(doc! {"listDatabases": 1, "authorizedDatabases": false})
            .await
            .map(|_| ())
    ));
    for who in [&everyreader, &monitor] {
        let listed = names(
            who.database("admin")
                .run_command(doc! {"listDatabases": 1})
                .await?,
        );
        assert!(
            listed.contains(&"app".to_string()) && listed.contains(&"other".to_string()),
            "{listed:?}"
        );
    }
    let status = reader
        .database("admin")
        .run_command(doc! {"connectionStatus": 1})
        .await?;
    let roles = status
        .get_document("authInfo")?
        .get_array("authenticatedUserRoles")?;
    assert_eq!(
        roles,
        &vec![mongodb::bson::Bson::Document(
            doc! {"role": "read", "db": "app"}
        )],
        "{status}"
    );
    // With showPrivileges, what the role grants, action by action (MongoDB's read role).
    let status = reader
        .database("admin")
        .run_command(doc! {"connectionStatus": 1, "showPrivileges": true})
        .await?;
    let privileges = status
        .get_document("authInfo")?
        .get_array("authenticatedUserPrivileges")?;
    let actions = actions_on_app(privileges);
    assert!(
        actions.contains(&"find") && actions.contains(&"changeStream"),
        "{status}"
    );
    assert!(!actions.contains(&"insert"), "{status}");
    Ok(())
}

/// Custom roles: privileges on resources, inheritance, and the checks on changing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_roles_grant_their_privileges_and_what_they_inherit() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (p, boss) = with_root_user(dir.path()).await?;
    let admin = boss.database("admin");
    let app_db = boss.database("app");
    app_db
        .run_command(doc! {
            "createRole": "watcher",
            "privileges": [{"resource": {"db": "app", "collection": "c"},
                            "actions": ["find", "changeStream"]}],
            "roles": [],
        })
        .await?;
    admin
        .run_command(doc! {
            "createRole": "auditor",
            "privileges": [{"resource": {"cluster": true}, "actions": ["serverStatus"]}],
            "roles": [{"role": "watcher", "db": "app"}],
        })
        .await?;
    admin
        .run_command(
            doc! {"createUser": "ann", "pwd": "pw", "roles": [{"role": "auditor", "db": "admin"}]},
        )
        .await?;
    app_db
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 0})
        .await?;

    let ann = client(&uri(p.addr, "ann:pw@", "")).await?;
    let c = ann.database("app").collection::<Document>("c");
    assert!(c.find_one(doc! {}).await?.is_some(), "inherited find");
    let mut stream = c.watch().await?;
    ann.database("admin")
        .run_command(doc! {"serverStatus": 1})
        .await?;
    let refused = |r: Result<(), mongodb::error::Error>| match r {
        Ok(()) => false,
        Err(e) => code(&e) == Some(13),
    };
    assert!(
        refused(c.insert_one(doc! {}).await.map(|_| ())),
        "no insert action"
    );
    assert!(refused(
        ann.database("app")
            .collection::<Document>("d")
            .find_one(doc! {})
            .await
            .map(|_| ())
    ));
    assert!(
        refused(ann.database("app").watch().await.map(|_| ())),
        "only collection c"
    );
    assert!(refused(
        ann.database("admin")
            .run_command(doc! {"currentOp": 1})
            .await
            .map(|_| ())
    ));
    app_db
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1})
        .await?;
    assert!(stream.try_next().await?.is_some(), "the watch sees it");

    // rolesInfo shows the role, what it inherits, and with showPrivileges its privileges.
    let info = admin
        .run_command(doc! {"rolesInfo": "auditor", "showPrivileges": true})
        .await?;
    let role = first_role(&info)?;
    assert_eq!(role.get_str("role")?, "auditor");
    assert!(!role.get_bool("isBuiltin")?);
    assert_eq!(role.get_array("roles")?.len(), 1);
    assert_eq!(role.get_array("inheritedPrivileges")?.len(), 2, "{role}");
    assert_eq!(
        role.get_array("inheritedRoles")?,
        &vec![Bson::Document(doc! {"role": "watcher", "db": "app"})],
        "{role}"
    );
    let listed = app_db.run_command(doc! {"rolesInfo": 1}).await?;
    assert_eq!(listed.get_array("roles")?.len(), 1);
    // A custom role inheriting a built-in one: the built-in's sub-roles and privileges are
    // inherited too, merged with its own by resource.
    app_db
        .run_command(doc! {
            "createRole": "curator",
            "privileges": [{"resource": {"db": "app", "collection": ""}, "actions": ["collMod"]}],
            "roles": ["dbOwner"],
        })
        .await?;
    let info = app_db
        .run_command(doc! {"rolesInfo": "curator", "showPrivileges": true})
        .await?;
    let curator = first_role(&info)?;
    let inherited = curator.get_array("inheritedRoles")?;
    for name in ["dbOwner", "readWrite", "dbAdmin", "userAdmin"] {
        assert!(
            inherited.contains(&Bson::Document(doc! {"role": name, "db": "app"})),
            "{name}: {curator}"
        );
    }
    assert_eq!(
        actions_on_app(curator.get_array("privileges")?),
        vec!["collMod"]
    );
    let actions = actions_on_app(curator.get_array("inheritedPrivileges")?);
    for action in ["collMod", "find", "insert", "changeStream", "createUser"] {
        assert!(actions.contains(&action), "{action}: {curator}");
    }
    app_db.run_command(doc! {"dropRole": "curator"}).await?;
    // A built-in role: the roles it names, its own privileges, and all it grants.
    let info = admin
        .run_command(doc! {"rolesInfo": {"role": "dbOwner", "db": "app"}, "showPrivileges": true})
        .await?;
    let owner = first_role(&info)?;
    assert!(owner.get_bool("isBuiltin")?);
    assert_eq!(owner.get_array("roles")?.len(), 3, "{owner}");
    assert!(owner.get_array("privileges")?.is_empty(), "{owner}");
    let actions = actions_on_app(owner.get_array("inheritedPrivileges")?);
    for action in ["insert", "collMod", "createUser"] {
        assert!(actions.contains(&action), "{action}: {owner}");
    }

    // What MongoDB refuses.
    for (cmd, expected) in [
        (
            doc! {"createRole": "watcher", "privileges": [], "roles": []},
            51002,
        ),
        (
            doc! {"createRole": "read", "privileges": [], "roles": []},
            2,
        ),
        (
            doc! {"createRole": "x", "privileges": [{"resource": {"db": "app", "collection": ""}, "actions": ["fly"]}], "roles": []},
            2,
        ),
        (
            doc! {"createRole": "x", "privileges": [], "roles": ["nonesuch"]},
            31,
        ),
        (
            doc! {"createUser": "y", "pwd": "p", "roles": ["nonesuch"]},
            31,
        ),
        (
            doc! {"grantRolesToRole": "watcher", "roles": [{"role": "auditor", "db": "admin"}]},
            4,
        ),
        (doc! {"dropRole": "nonesuch"}, 31),
    ] {
        let e = app_db.run_command(cmd.clone()).await.expect_err("refused");
        assert_eq!(code(&e), Some(expected), "{cmd}: {e}");
    }

    // Privileges granted and revoked, then the role dropped: a new login sees each change.
    app_db
        .run_command(doc! {
            "grantPrivilegesToRole": "watcher",
            "privileges": [{"resource": {"db": "app", "collection": "c"}, "actions": ["insert"]}],
        })
        .await?;
    let ann = client(&uri(p.addr, "ann:pw@", "")).await?;
    let c = ann.database("app").collection::<Document>("c");
    c.insert_one(doc! {"_id": 2}).await?;
    app_db.run_command(doc! {"dropRole": "watcher"}).await?;
    let ann = client(&uri(p.addr, "ann:pw@", "")).await?;
    let c = ann.database("app").collection::<Document>("c");
    assert!(
        refused(c.find_one(doc! {}).await.map(|_| ())),
        "the role is gone"
    );
    let info = admin.run_command(doc! {"rolesInfo": "auditor"}).await?;
    let role = first_role(&info)?;
    assert!(
        role.get_array("roles")?.is_empty(),
        "dropRole took it from auditor too"
    );
    Ok(())
}

/// A cursor (a change stream's too) belongs to the user who opened it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_cursor_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (p, boss) = with_root_user(dir.path()).await?;
    for user in ["alice", "bob"] {
        boss.database("app")
            .run_command(doc! {"createUser": user, "pwd": "pw", "roles": ["readWrite"]})
            .await?;
    }
    boss.database("app")
        .collection::<Document>("c")
        .insert_many((0..10).map(|i| doc! {"_id": i}))
        .await?;
    let alice = client(&uri(p.addr, "alice:pw@", "&authSource=app")).await?;
    let bob = client(&uri(p.addr, "bob:pw@", "&authSource=app")).await?;
    let app_alice = alice.database("app");
    let app_bob = bob.database("app");
    let opened = app_alice
        .run_command(doc! {"find": "c", "batchSize": 2})
        .await?;
    let id = opened.get_document("cursor")?.get_i64("id")?;
    assert_ne!(id, 0);
    let stream = app_alice
        .run_command(doc! {"aggregate": "c", "pipeline": [{"$changeStream": {}}], "cursor": {}})
        .await?;
    let stream_id = stream.get_document("cursor")?.get_i64("id")?;
    for cursor in [id, stream_id] {
        let e = app_bob
            .run_command(doc! {"getMore": cursor, "collection": "c"})
            .await
            .expect_err("not bob's");
        assert_eq!(code(&e), Some(13), "{e}");
        let e = app_bob
            .run_command(doc! {"killCursors": "c", "cursors": [cursor]})
            .await
            .expect_err("not bob's");
        assert_eq!(code(&e), Some(13), "{e}");
    }
    let more = app_alice
        .run_command(doc! {"getMore": id, "collection": "c"})
        .await?;
    assert!(
        !more
            .get_document("cursor")?
            .get_array("nextBatch")?
            .is_empty()
    );
    app_alice
        .run_command(doc! {"killCursors": "c", "cursors": [stream_id]})
        .await?;
    Ok(())
}

/// With `--auth` the router signs the cluster times it gives out, and a client can move the
/// clock only with one it signed: a forged `$clusterTime` is refused (204).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cluster_time_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let p = server(dir.path()).await?;
    let raw = wire::client::Client::new(p.addr.to_string());
    let first = raw.command("admin", &doc! {"ping": 1}).await?;
    let signed = first.get_document("$clusterTime")?.clone();
    let hash = signed
        .get_document("signature")?
        .get_binary_generic("hash")?;
    assert!(hash.iter().any(|b| *b != 0), "signed: {signed}");
    // The time as given comes back without trouble.
    let echoed = raw
        .command("admin", &doc! {"ping": 1, "$clusterTime": signed.clone()})
        .await?;
    assert_eq!(echoed.get_f64("ok").ok(), Some(1.0), "{echoed}");
    // The same signature on a later time does not check out.
    let mut forged = signed.clone();
    let t = forged.get_timestamp("clusterTime")?;
    forged.insert(
        "clusterTime",
        mongodb::bson::Timestamp {
            time: t.time + 100,
            increment: 1,
        },
    );
    let refused = raw
        .command("admin", &doc! {"ping": 1, "$clusterTime": forged})
        .await?;
    assert_eq!(refused.get_i32("code").ok(), Some(204), "{refused}");
    let after = raw.command("admin", &doc! {"ping": 1}).await?;
    let now = after
        .get_document("$clusterTime")?
        .get_timestamp("clusterTime")?;
    assert!(now.time < t.time + 100, "the forged time was not adopted");
    Ok(())
}

/// `killAllSessions` with a user pattern ends that user's sessions and no one else's: the
/// router stamps each session with its owner (`lsid.uid`, the SHA-256 of `user@db`, as mongos
/// does), so the shards know whose transaction is whose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_all_sessions_of_a_user_aborts_only_that_users_transactions() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (p, boss) = with_root_user(dir.path()).await?;
    for user in ["alice", "bob"] {
        boss.database("admin")
            .run_command(doc! {"createUser": user, "pwd": "pw", "roles": ["readWriteAnyDatabase"]})
            .await?;
    }
    let alice = client(&uri(p.addr, "alice:pw@", "")).await?;
    let bob = client(&uri(p.addr, "bob:pw@", "")).await?;
    boss.database("k")
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 0})
        .await?;
    let mut sessions = Vec::new();
    for (name, who) in [("alice", &alice), ("bob", &bob)] {
        let mut session = who.start_session().await?;
        session.start_transaction().await?;
        who.database("k")
            .collection::<Document>("c")
            .insert_one(doc! {"_id": name})
            .session(&mut session)
            .await?;
        sessions.push(session);
    }
    boss.database("admin")
        .run_command(doc! {"killAllSessions": [{"user": "alice", "db": "admin"}]})
        .await?;
    let mut bobs = sessions.pop().expect("bob's session");
    let mut alices = sessions.pop().expect("alice's session");
    let err = alices
        .commit_transaction()
        .await
        .expect_err("alice's transaction was aborted");
    assert_eq!(code(&err), Some(251), "{err}");
    bobs.commit_transaction().await?;
    let ids: Vec<Document> = boss
        .database("k")
        .collection::<Document>("c")
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await?
        .try_collect()
        .await?;
    assert_eq!(ids, vec![doc! {"_id": 0}, doc! {"_id": "bob"}]);
    Ok(())
}
