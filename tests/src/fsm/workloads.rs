//! The FSM workloads of the change-stream suites. Each thread owns the document `_id`s and
//! namespaces it writes (single writer per key), so the model of expected events and documents
//! it records is exact; a write with an unknown outcome abandons what it touched.
//!
//! * [`Crud`]: inserts, updates, replaces, deletes, multi-document updates and deletes and
//!   findAndModify on a hashed-sharded, a range-sharded and an unsharded collection, watched at
//!   collection, database and cluster level.
//! * [`Ddl`]: per-thread collections created, filled, indexed, renamed, sharded and dropped,
//!   watched at database and cluster level with `showExpandedEvents`.
//! * [`Transfers`]: multi-document transactions moving amounts between a thread's accounts in
//!   a hashed collection (so most transfers span shards), some aborted on purpose. A
//!   transaction records its effects with one `step`, so the verifier accepts its events in
//!   any order among themselves, exactly once if committed and never if aborted; every
//!   snapshot read must find the total of all balances unchanged.
//!
//! Seam for later: pre/post images (the model's documents are the post-images; the pre-image
//! is the previous state).

use anyhow::{Result, bail};
use futures::FutureExt;
use futures::future::BoxFuture;
use mongodb::bson::{Bson, Document, doc};
use mongodb::{Collection, IndexModel};
use rand::Rng;

use super::framework::{Config, Effect, Env, ThreadCtx, Workload, Written};
use super::model::{Op, Scope, WatchSpec};

/// The names [`by_name`] knows.
pub const NAMES: &[&str] = &["crud", "ddl", "transfers"];

/// A workload by name, type-erased for the suite runner.
pub enum Any {
    Crud(Crud),
    Ddl(Ddl),
    Transfers(Transfers),
}

pub fn by_name(name: &str) -> Option<Any> {
    match name {
        "crud" => Some(Any::Crud(Crud)),
        "ddl" => Some(Any::Ddl(Ddl)),
        "transfers" => Some(Any::Transfers(Transfers)),
        _ => None,
    }
}

/// CRUD on three collections: `hashed` (`{_id: "hashed"}`), `range` (`{_id: 1}`), `plain`.
pub struct Crud;

const CRUD_COLLS: [&str; 3] = ["hashed", "range", "plain"];

#[derive(Debug, Clone)]
struct Owned {
    coll: &'static str,
    id: i64,
    doc: Document,
}

#[derive(Default)]
pub struct CrudData {
    owned: Vec<Owned>,
}

fn sorted(d: &Document) -> Document {
    let mut keys: Vec<&String> = d.keys().collect();
    keys.sort();
    keys.into_iter()
        .filter_map(|k| d.get(k).map(|v| (k.clone(), v.clone())))
        .collect()
}

/// The model's state of a document after `$set: {w}` and `$inc: {n: 1}`.
fn updated(doc: &Document, w: i64) -> Document {
    let mut d = doc.clone();
    let n = match d.get("n") {
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Int32(n)) => i64::from(*n),
        _ => 0,
    };
    d.insert("w", w);
    d.insert("n", n + 1);
    sorted(&d)
}

impl Crud {
    fn coll(t: &ThreadCtx, name: &str) -> Collection<Document> {
        t.client.database(&t.db).collection(name)
    }

    fn pick(t: &mut ThreadCtx, d: &CrudData) -> Option<usize> {
        if d.owned.is_empty() {
            None
        } else {
            Some(t.rng.random_range(0..d.owned.len()))
        }
    }

    async fn insert(&self, d: &mut CrudData, t: &mut ThreadCtx, n: usize) -> Result<()> {
        let coll = CRUD_COLLS[t.rng.random_range(0..CRUD_COLLS.len())];
        let mut docs = Vec::new();
        let mut effects = Vec::new();
        for _ in 0..n {
            let id = t.unique();
            let w = t.unique();
            let doc = sorted(&doc! {"_id": id, "t": t.tid as i64, "w": w, "n": 0_i64});
            effects.push(Effect::crud(
                coll,
                Op::Insert,
                Bson::Int64(id),
                Some(Bson::Int64(w)),
                Some(doc.clone()),
            ));
            docs.push(doc);
        }
        let c = Self::coll(t, coll);
        let res = if n == 1 {
            let one = docs[0].clone();
            t.write(effects, async { c.insert_one(one).await.map(|_| ()) })
                .await?
        } else {
            let many = docs.clone();
            t.write(effects, async { c.insert_many(many).await.map(|_| ()) })
                .await?
        };
        if let Written::Acked(()) = res {
            for doc in docs {
                let id = doc.get_i64("_id")?;
                d.owned.push(Owned { coll, id, doc });
            }
        }
        Ok(())
    }

    async fn update_one(&self, d: &mut CrudData, t: &mut ThreadCtx, fam: bool) -> Result<()> {
        let Some(i) = Self::pick(t, d) else {
            return self.insert(d, t, 1).await;
        };
        let o = d.owned.swap_remove(i);
        let w = t.unique();
        let after = updated(&o.doc, w);
        let c = Self::coll(t, o.coll);
        let effects = vec![Effect::crud(
            o.coll,
            Op::Update,
            Bson::Int64(o.id),
            Some(Bson::Int64(w)),
            Some(after.clone()),
        )];
        let filter = doc! {"_id": o.id};
        let update = doc! {"$set": {"w": w}, "$inc": {"n": 1_i64}};
        let res = if fam {
            t.write(effects, async {
                let r = c.find_one_and_update(filter, update).await?;
                Ok(r.is_some())
            })
            .await?
        } else {
            t.write(effects, async {
                let r = c.update_one(filter, update).await?;
                Ok(r.modified_count == 1)
            })
            .await?
        };
        match res {
            Written::Acked(true) => d.owned.push(Owned { doc: after, ..o }),
            Written::Acked(false) => bail!("update of owned document {} matched nothing", o.id),
            Written::Unknown(_) => {}
        }
        Ok(())
    }

    async fn replace(&self, d: &mut CrudData, t: &mut ThreadCtx) -> Result<()> {
        let Some(i) = Self::pick(t, d) else {
            return self.insert(d, t, 1).await;
        };
        let o = d.owned.swap_remove(i);
        let w = t.unique();
        let after = sorted(&doc! {"_id": o.id, "t": t.tid as i64, "w": w, "r": true});
        let c = Self::coll(t, o.coll);
        let effects = vec![Effect::crud(
            o.coll,
            Op::Replace,
            Bson::Int64(o.id),
            Some(Bson::Int64(w)),
            Some(after.clone()),
        )];
        let replacement = doc! {"t": t.tid as i64, "w": w, "r": true};
        let res = t
            .write(effects, async {
                let r = c.replace_one(doc! {"_id": o.id}, replacement).await?;
                Ok(r.modified_count == 1)
            })
            .await?;
        match res {
            Written::Acked(true) => d.owned.push(Owned { doc: after, ..o }),
            Written::Acked(false) => bail!("replace of owned document {} matched nothing", o.id),
            Written::Unknown(_) => {}
        }
        Ok(())
    }

    async fn delete_one(&self, d: &mut CrudData, t: &mut ThreadCtx) -> Result<()> {
        let Some(i) = Self::pick(t, d) else {
            return self.insert(d, t, 1).await;
        };
        let o = d.owned.swap_remove(i);
        let c = Self::coll(t, o.coll);
        let effects = vec![Effect::crud(
            o.coll,
            Op::Delete,
            Bson::Int64(o.id),
            None,
            None,
        )];
        let res = t
            .write(effects, async {
                Ok(c.delete_one(doc! {"_id": o.id}).await?.deleted_count)
            })
            .await?;
        if let Written::Acked(n) = res
            && n != 1
        {
            bail!("delete of owned document {} deleted {n}", o.id);
        }
        Ok(())
    }

    /// `updateMany` / `deleteMany` over the thread's documents in one collection.
    async fn many(&self, d: &mut CrudData, t: &mut ThreadCtx, delete: bool) -> Result<()> {
        let coll = CRUD_COLLS[t.rng.random_range(0..CRUD_COLLS.len())];
        let (mine, rest): (Vec<Owned>, Vec<Owned>) =
            d.owned.drain(..).partition(|o| o.coll == coll);
        d.owned = rest;
        // Half of them, at most 6.
        let take = (mine.len() / 2).min(6);
        let (chosen, keep) = mine.split_at(take);
        d.owned.extend(keep.iter().cloned());
        if chosen.is_empty() {
            return self.insert(d, t, 3).await;
        }
        let ids: Vec<i64> = chosen.iter().map(|o| o.id).collect();
        let c = Self::coll(t, coll);
        let filter = doc! {"_id": {"$in": ids.clone()}};
        if delete {
            let effects = chosen
                .iter()
                .map(|o| Effect::crud(coll, Op::Delete, Bson::Int64(o.id), None, None))
                .collect();
            let res = t
                .write(effects, async {
                    Ok(c.delete_many(filter).await?.deleted_count)
                })
                .await?;
            if let Written::Acked(n) = res
                && n != ids.len() as u64
            {
                bail!("deleteMany of {} owned documents deleted {n}", ids.len());
            }
        } else {
            let w = t.unique();
            let afters: Vec<Document> = chosen.iter().map(|o| updated(&o.doc, w)).collect();
            let effects = chosen
                .iter()
                .zip(&afters)
                .map(|(o, a)| {
                    Effect::crud(
                        coll,
                        Op::Update,
                        Bson::Int64(o.id),
                        Some(Bson::Int64(w)),
                        Some(a.clone()),
                    )
                })
                .collect();
            let update = doc! {"$set": {"w": w}, "$inc": {"n": 1_i64}};
            let res = t
                .write(effects, async {
                    Ok(c.update_many(filter, update).await?.modified_count)
                })
                .await?;
            match res {
                Written::Acked(n) if n == ids.len() as u64 => {
                    for (o, a) in chosen.iter().zip(afters) {
                        d.owned.push(Owned {
                            doc: a,
                            ..o.clone()
                        });
                    }
                }
                Written::Acked(n) => {
                    bail!("updateMany of {} owned documents modified {n}", ids.len())
                }
                Written::Unknown(_) => {}
            }
        }
        Ok(())
    }
}

impl Workload for Crud {
    type Data = CrudData;

    fn name(&self) -> &'static str {
        "crud"
    }

    fn config(&self) -> Config {
        let all = vec![
            ("insert", 3.0),
            ("update", 3.0),
            ("findAndModify", 1.0),
            ("replace", 1.0),
            ("delete", 1.0),
            ("updateMany", 1.0),
            ("deleteMany", 0.5),
        ];
        Config {
            thread_count: 4,
            iterations: 40,
            start_state: "init",
            states: vec![
                "init",
                "insert",
                "update",
                "findAndModify",
                "replace",
                "delete",
                "updateMany",
                "deleteMany",
            ],
            transitions: [
                "init",
                "insert",
                "update",
                "findAndModify",
                "replace",
                "delete",
                "updateMany",
                "deleteMany",
            ]
            .into_iter()
            .map(|s| (s, all.clone()))
            .collect(),
        }
    }

    fn data(&self, _tid: usize) -> CrudData {
        CrudData::default()
    }

    fn setup<'a>(&'a self, env: &'a Env) -> BoxFuture<'a, Result<Vec<String>>> {
        async move {
            let admin = env.client.database("admin");
            admin
                .run_command(doc! {"enableSharding": env.db.clone()})
                .await?;
            admin
                .run_command(doc! {"shardCollection": format!("{}.hashed", env.db),
                "key": {"_id": "hashed"}})
                .await?;
            admin
                .run_command(doc! {"shardCollection": format!("{}.range", env.db),
                "key": {"_id": 1}})
                .await?;
            let db = env.client.database(&env.db);
            db.run_command(
                doc! {"create": "plain", "changeStreamPreAndPostImages": {"enabled": true}},
            )
            .await?;
            // Pre-images on every shard of the sharded one too (image watchers require them).
            db.run_command(
                doc! {"collMod": "hashed", "changeStreamPreAndPostImages": {"enabled": true}},
            )
            .await?;
            Ok(CRUD_COLLS.iter().map(|c| c.to_string()).collect())
        }
        .boxed()
    }

    fn state<'a>(
        &'a self,
        state: &'static str,
        d: &'a mut CrudData,
        t: &'a mut ThreadCtx,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            match state {
                "init" => self.insert(d, t, 5).await,
                "insert" => {
                    let n = if t.rng.random_bool(0.3) { 3 } else { 1 };
                    self.insert(d, t, n).await
                }
                "update" => self.update_one(d, t, false).await,
                "findAndModify" => self.update_one(d, t, true).await,
                "replace" => self.replace(d, t).await,
                "delete" => self.delete_one(d, t).await,
                "updateMany" => self.many(d, t, false).await,
                "deleteMany" => self.many(d, t, true).await,
                other => bail!("unknown state {other}"),
            }
        }
        .boxed()
    }

    fn watch_specs(&self, db: &str) -> Vec<WatchSpec> {
        let mut specs: Vec<WatchSpec> = CRUD_COLLS
            .iter()
            .map(|c| WatchSpec {
                scope: Scope::Collection {
                    db: db.to_string(),
                    coll: c.to_string(),
                },
                expanded: false,
                images: false,
            })
            .collect();
        specs.push(WatchSpec {
            scope: Scope::Database(db.to_string()),
            expanded: false,
            images: false,
        });
        specs.push(WatchSpec {
            scope: Scope::Cluster,
            expanded: false,
            images: false,
        });
        // Images `required` where every write records them: checked on every event.
        for coll in ["hashed", "plain"] {
            specs.push(WatchSpec {
                scope: Scope::Collection {
                    db: db.to_string(),
                    coll: coll.to_string(),
                },
                expanded: false,
                images: true,
            });
        }
        specs
    }
}

/// DDL mixed with inserts on per-thread collections `t<tid>_g<generation>`.
pub struct Ddl;

#[derive(Debug, Clone)]
struct Current {
    name: String,
    sharded: bool,
    docs: usize,
    indexes: Vec<String>,
}

#[derive(Default)]
pub struct DdlData {
    generation: u32,
    current: Option<Current>,
}

impl Ddl {
    fn next_name(t: &ThreadCtx, d: &mut DdlData) -> String {
        d.generation += 1;
        format!("t{}_g{}", t.tid, d.generation)
    }

    /// After an unknown outcome: stop using the namespaces it touched.
    fn abandon(t: &mut ThreadCtx, d: &mut DdlData, names: &[&str]) {
        for n in names {
            let ns = t.ns(n);
            t.docs.tainted.insert(ns.clone());
            t.docs.existing.remove(&ns);
            t.docs.docs.remove(&ns);
        }
        d.current = None;
    }

    async fn create(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        if d.current.is_some() {
            return self.insert(d, t).await;
        }
        self.create_new(d, t).await
    }

    async fn create_new(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let name = Self::next_name(t, d);
        let db = t.client.database(&t.db);
        let effects = vec![Effect::ddl(&name, Op::Create, None)];
        let n = name.clone();
        match t
            .write(effects, async { db.create_collection(n).await })
            .await?
        {
            Written::Acked(()) => {
                t.docs.existing.insert(t.ns(&name));
                d.current = Some(Current {
                    name,
                    sharded: false,
                    docs: 0,
                    indexes: Vec::new(),
                });
            }
            Written::Unknown(_) => Self::abandon(t, d, &[&name]),
        }
        Ok(())
    }

    async fn insert(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let Some(cur) = d.current.clone() else {
            return self.create_new(d, t).await;
        };
        let id = t.unique();
        let w = t.unique();
        let doc = sorted(&doc! {"_id": id, "t": t.tid as i64, "w": w, "n": 0_i64});
        let c: Collection<Document> = t.client.database(&t.db).collection(&cur.name);
        let effects = vec![Effect::crud(
            &cur.name,
            Op::Insert,
            Bson::Int64(id),
            Some(Bson::Int64(w)),
            Some(doc.clone()),
        )];
        match t
            .write(effects, async { c.insert_one(doc).await.map(|_| ()) })
            .await?
        {
            Written::Acked(()) => {
                if let Some(c) = d.current.as_mut() {
                    c.docs += 1;
                }
            }
            // The document may or may not be there: the model says so; keep the collection.
            Written::Unknown(_) => {}
        }
        Ok(())
    }

    async fn create_index(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let Some(cur) = d.current.clone() else {
            return self.create_new(d, t).await;
        };
        if cur.sharded {
            // Index events on a sharded collection come from every shard holding it; MongoDB's
            // own FSM leaves them out for that reason.
            return self.insert(d, t).await;
        }
        let u = t.unique();
        let iname = format!("i{u}");
        let c: Collection<Document> = t.client.database(&t.db).collection(&cur.name);
        let model = IndexModel::builder()
            .keys(doc! {format!("k{u}"): 1})
            .options(
                mongodb::options::IndexOptions::builder()
                    .name(iname.clone())
                    .build(),
            )
            .build();
        let effects = vec![Effect::ddl(
            &cur.name,
            Op::CreateIndexes,
            Some(Bson::String(iname.clone())),
        )];
        match t
            .write(effects, async { c.create_index(model).await.map(|_| ()) })
            .await?
        {
            Written::Acked(()) => {
                if let Some(c) = d.current.as_mut() {
                    c.indexes.push(iname);
                }
            }
            Written::Unknown(_) => Self::abandon(t, d, &[&cur.name]),
        }
        Ok(())
    }

    async fn drop_index(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let Some(cur) = d.current.clone() else {
            return self.create_new(d, t).await;
        };
        let Some(iname) = cur.indexes.first().cloned() else {
            return self.create_index(d, t).await;
        };
        let c: Collection<Document> = t.client.database(&t.db).collection(&cur.name);
        let effects = vec![Effect::ddl(
            &cur.name,
            Op::DropIndexes,
            Some(Bson::String(iname.clone())),
        )];
        let i = iname.clone();
        match t.write(effects, async { c.drop_index(i).await }).await? {
            Written::Acked(()) => {
                if let Some(c) = d.current.as_mut() {
                    c.indexes.retain(|x| x != &iname);
                }
            }
            Written::Unknown(_) => Self::abandon(t, d, &[&cur.name]),
        }
        Ok(())
    }

    async fn rename(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let Some(cur) = d.current.clone() else {
            return self.create_new(d, t).await;
        };
        if cur.sharded {
            return self.insert(d, t).await;
        }
        let to = Self::next_name(t, d);
        let from_ns = t.ns(&cur.name);
        let to_ns = t.ns(&to);
        let effects = vec![Effect::ddl(
            &cur.name,
            Op::Rename,
            Some(Bson::String(to_ns.clone())),
        )];
        let admin = t.client.database("admin");
        let cmd = doc! {"renameCollection": from_ns.clone(), "to": to_ns.clone()};
        match t
            .write(effects, async { admin.run_command(cmd).await.map(|_| ()) })
            .await?
        {
            Written::Acked(()) => {
                t.docs.rename(&from_ns, &to_ns);
                if let Some(c) = d.current.as_mut() {
                    c.name = to;
                }
            }
            Written::Unknown(_) => Self::abandon(t, d, &[&cur.name, &to]),
        }
        Ok(())
    }

    async fn drop(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let Some(cur) = d.current.clone() else {
            return self.create_new(d, t).await;
        };
        let c: Collection<Document> = t.client.database(&t.db).collection(&cur.name);
        let effects = vec![Effect::ddl(&cur.name, Op::Drop, None)];
        match t.write(effects, async { c.drop().await }).await? {
            Written::Acked(()) => {
                let ns = t.ns(&cur.name);
                t.docs.drop_ns(&ns);
                d.current = None;
            }
            Written::Unknown(_) => Self::abandon(t, d, &[&cur.name]),
        }
        Ok(())
    }

    async fn shard(&self, d: &mut DdlData, t: &mut ThreadCtx) -> Result<()> {
        let Some(cur) = d.current.clone() else {
            return self.create_new(d, t).await;
        };
        if cur.sharded || cur.docs > 0 || !cur.indexes.is_empty() {
            return self.insert(d, t).await;
        }
        let ns = t.ns(&cur.name);
        let effects = vec![Effect::ddl(&cur.name, Op::ShardCollection, None)];
        let admin = t.client.database("admin");
        let cmd = doc! {"shardCollection": ns, "key": {"_id": "hashed"}};
        match t
            .write(effects, async { admin.run_command(cmd).await.map(|_| ()) })
            .await?
        {
            Written::Acked(()) => {
                if let Some(c) = d.current.as_mut() {
                    c.sharded = true;
                }
            }
            Written::Unknown(_) => Self::abandon(t, d, &[&cur.name]),
        }
        Ok(())
    }
}

impl Workload for Ddl {
    type Data = DdlData;

    fn name(&self) -> &'static str {
        "ddl"
    }

    fn config(&self) -> Config {
        let states = vec![
            "create",
            "insert",
            "createIndex",
            "dropIndex",
            "rename",
            "drop",
            "shard",
        ];
        let weights = vec![
            ("create", 1.0),
            ("insert", 4.0),
            ("createIndex", 1.0),
            ("dropIndex", 1.0),
            ("rename", 1.0),
            ("drop", 0.7),
            ("shard", 0.5),
        ];
        Config {
            thread_count: 3,
            iterations: 30,
            start_state: "create",
            transitions: states.iter().map(|s| (*s, weights.clone())).collect(),
            states,
        }
    }

    fn data(&self, _tid: usize) -> DdlData {
        DdlData::default()
    }

    fn setup<'a>(&'a self, env: &'a Env) -> BoxFuture<'a, Result<Vec<String>>> {
        async move {
            env.client
                .database("admin")
                .run_command(doc! {"enableSharding": env.db.clone()})
                .await?;
            Ok(Vec::new())
        }
        .boxed()
    }

    fn state<'a>(
        &'a self,
        state: &'static str,
        d: &'a mut DdlData,
        t: &'a mut ThreadCtx,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            match state {
                "create" => self.create(d, t).await,
                "insert" => self.insert(d, t).await,
                "createIndex" => self.create_index(d, t).await,
                "dropIndex" => self.drop_index(d, t).await,
                "rename" => self.rename(d, t).await,
                "drop" => self.drop(d, t).await,
                "shard" => self.shard(d, t).await,
                other => bail!("unknown state {other}"),
            }
        }
        .boxed()
    }

    fn watch_specs(&self, db: &str) -> Vec<WatchSpec> {
        vec![
            WatchSpec {
                scope: Scope::Database(db.to_string()),
                expanded: true,
                images: false,
            },
            WatchSpec {
                scope: Scope::Cluster,
                expanded: true,
                images: false,
            },
            WatchSpec {
                scope: Scope::Database(db.to_string()),
                expanded: false,
                images: false,
            },
        ]
    }
}

/// Transfers between a thread's accounts, in transactions, on a hashed collection.
pub struct Transfers;

/// Every account starts with this balance; transfers keep the total.
const OPENING_BALANCE: i64 = 100;

#[derive(Default)]
pub struct TransfersData {
    /// The thread's accounts it still knows the state of.
    accounts: Vec<Document>,
}

impl Transfers {
    fn coll(t: &ThreadCtx) -> Collection<Document> {
        t.client.database(&t.db).collection("accounts")
    }

    async fn open_accounts(&self, d: &mut TransfersData, t: &mut ThreadCtx) -> Result<()> {
        let mut docs = Vec::new();
        let mut effects = Vec::new();
        for _ in 0..4 {
            let id = t.unique();
            let w = t.unique();
            let doc = sorted(&doc! {"_id": id, "balance": OPENING_BALANCE, "w": w});
            effects.push(Effect::crud(
                "accounts",
                Op::Insert,
                Bson::Int64(id),
                Some(Bson::Int64(w)),
                Some(doc.clone()),
            ));
            docs.push(doc);
        }
        let c = Self::coll(t);
        let many = docs.clone();
        if let Written::Acked(()) = t
            .write(effects, async { c.insert_many(many).await.map(|_| ()) })
            .await?
        {
            d.accounts.extend(docs);
        }
        Ok(())
    }

    /// Moves an amount between two of the thread's accounts in one transaction; `commit`
    /// false aborts it instead (and it must leave no trace).
    async fn transfer(&self, d: &mut TransfersData, t: &mut ThreadCtx, commit: bool) -> Result<()> {
        if d.accounts.len() < 2 {
            return self.open_accounts(d, t).await;
        }
        let i = t.rng.random_range(0..d.accounts.len());
        let from = d.accounts.swap_remove(i);
        let j = t.rng.random_range(0..d.accounts.len());
        let to = d.accounts.swap_remove(j);
        let amount = t.rng.random_range(1..=10_i64);
        let (wf, wt) = (t.unique(), t.unique());
        let moved = |doc: &Document, delta: i64, w: i64| {
            let mut after = doc.clone();
            after.insert("balance", doc.get_i64("balance").unwrap_or(0) + delta);
            after.insert("w", w);
            sorted(&after)
        };
        let (from_after, to_after) = (moved(&from, -amount, wf), moved(&to, amount, wt));
        let id = |doc: &Document| doc.get("_id").cloned().unwrap_or(Bson::Null);
        let effects = if commit {
            vec![
                Effect::crud(
                    "accounts",
                    Op::Update,
                    id(&from),
                    Some(Bson::Int64(wf)),
                    Some(from_after.clone()),
                ),
                Effect::crud(
                    "accounts",
                    Op::Update,
                    id(&to),
                    Some(Bson::Int64(wt)),
                    Some(to_after.clone()),
                ),
            ]
        } else {
            Vec::new()
        };
        let c = Self::coll(t);
        let client = t.client.clone();
        let (fid, tid) = (id(&from), id(&to));
        let res = t
            .write(effects, async move {
                let mut s = client.start_session().await?;
                s.start_transaction().await?;
                c.update_one(
                    doc! {"_id": fid},
                    doc! {"$inc": {"balance": -amount}, "$set": {"w": wf}},
                )
                .session(&mut s)
                .await?;
                c.update_one(
                    doc! {"_id": tid},
                    doc! {"$inc": {"balance": amount}, "$set": {"w": wt}},
                )
                .session(&mut s)
                .await?;
                if commit {
                    s.commit_transaction().await
                } else {
                    s.abort_transaction().await
                }
            })
            .await?;
        match res {
            Written::Acked(()) if commit => d.accounts.extend([from_after, to_after]),
            Written::Acked(()) => d.accounts.extend([from, to]),
            // An aborted transaction's outcome is known (nothing) even when the abort failed:
            // it was never committed.
            Written::Unknown(_) if !commit => d.accounts.extend([from, to]),
            Written::Unknown(_) => {}
        }
        Ok(())
    }

    /// A snapshot read of every account: the total is the opening balance times the accounts.
    async fn check_total(&self, t: &mut ThreadCtx) -> Result<()> {
        let db = t.client.database(&t.db);
        let reply = match db
            .run_command(doc! {"find": "accounts", "batchSize": 100_000, "readConcern": {"level": "snapshot"}})
            .await
        {
            Ok(r) => r,
            Err(e) if t.faults && super::framework::unknown_outcome(&e) => return Ok(()),
            // A shard's history of replaced values is in memory: right after a restart it
            // starts at the restart, and a read as of a moment before is SnapshotTooOld.
            Err(e)
                if t.faults
                    && matches!(*e.kind, mongodb::error::ErrorKind::Command(ref c) if c.code == 239) =>
            {
                return Ok(());
            }
            Err(e) => bail!("a snapshot read of the accounts failed: {e}"),
        };
        let cursor = reply.get_document("cursor")?;
        if cursor.get_i64("id").unwrap_or(0) != 0 {
            bail!("the snapshot read did not fit one batch");
        }
        let docs = cursor.get_array("firstBatch")?;
        let total: i64 = docs
            .iter()
            .filter_map(|d| d.as_document()?.get_i64("balance").ok())
            .sum();
        let expected = OPENING_BALANCE * docs.len() as i64;
        if total != expected {
            bail!(
                "a snapshot saw {total} in {} accounts, not {expected}: a transaction showed in part",
                docs.len()
            );
        }
        Ok(())
    }
}

impl Workload for Transfers {
    type Data = TransfersData;

    fn name(&self) -> &'static str {
        "transfers"
    }

    fn config(&self) -> Config {
        let all = vec![("transfer", 6.0), ("abort", 1.0), ("checkTotal", 2.0)];
        Config {
            thread_count: 4,
            iterations: 40,
            start_state: "init",
            states: vec!["init", "transfer", "abort", "checkTotal"],
            transitions: ["init", "transfer", "abort", "checkTotal"]
                .into_iter()
                .map(|s| (s, all.clone()))
                .collect(),
        }
    }

    fn data(&self, _tid: usize) -> TransfersData {
        TransfersData::default()
    }

    fn setup<'a>(&'a self, env: &'a Env) -> BoxFuture<'a, Result<Vec<String>>> {
        async move {
            let admin = env.client.database("admin");
            admin
                .run_command(doc! {"enableSharding": env.db.clone()})
                .await?;
            admin
                .run_command(doc! {"shardCollection": format!("{}.accounts", env.db),
                "key": {"_id": "hashed"}})
                .await?;
            // Pre-images of the transactions' updates (a two-phase commit carries them).
            env.client
                .database(&env.db)
                .run_command(
                    doc! {"collMod": "accounts", "changeStreamPreAndPostImages": {"enabled": true}},
                )
                .await?;
            Ok(vec!["accounts".to_string()])
        }
        .boxed()
    }

    fn state<'a>(
        &'a self,
        state: &'static str,
        d: &'a mut TransfersData,
        t: &'a mut ThreadCtx,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            match state {
                "init" => self.open_accounts(d, t).await,
                "transfer" => self.transfer(d, t, true).await,
                "abort" => self.transfer(d, t, false).await,
                "checkTotal" => self.check_total(t).await,
                other => bail!("unknown state {other}"),
            }
        }
        .boxed()
    }

    fn watch_specs(&self, db: &str) -> Vec<WatchSpec> {
        vec![
            WatchSpec {
                scope: Scope::Collection {
                    db: db.to_string(),
                    coll: "accounts".to_string(),
                },
                expanded: false,
                images: false,
            },
            WatchSpec {
                scope: Scope::Collection {
                    db: db.to_string(),
                    coll: "accounts".to_string(),
                },
                expanded: false,
                images: true,
            },
            WatchSpec {
                scope: Scope::Database(db.to_string()),
                expanded: false,
                images: false,
            },
        ]
    }
}
