//! Exhaust cursors over the wire: a `getMore` sent with `exhaustAllowed` is answered with a
//! stream of replies flagged `moreToCome`, each answering the one before, until the cursor is
//! done; the last reply carries no flag. (The Rust driver does not use exhaust, so this test
//! speaks OP_MSG itself.)

use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};
use tests::EmbeddedCluster;
use wire::connection::Connection;
use wire::message::{Message, MsgFlags, Op};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhaust_get_more_streams_the_rest_of_the_cursor() -> anyhow::Result<()> {
    let cluster = EmbeddedCluster::start(1).await?;
    let client = cluster.client().await?;
    let coll = client.database("app").collection::<Document>("many");
    coll.insert_many((0..23).map(|i| doc! {"_id": i})).await?;

    let stream = tokio::net::TcpStream::connect(cluster.addr).await?;
    let mut conn = Connection::new(stream);
    let find = doc! {"find": "many", "batchSize": 5, "sort": {"_id": 1}, "$db": "app"};
    conn.write_message(&Message::msg(1, RawDocumentBuf::try_from(&find)?))
        .await?;
    let reply = conn.read_message().await?.expect("a reply to find");
    let Op::Msg(first) = reply.op else {
        anyhow::bail!("not an OP_MSG")
    };
    let first = Document::try_from(first.body.as_ref())?;
    let cursor = first.get_document("cursor")?;
    let id = cursor.get_i64("id")?;
    let mut seen: Vec<i32> = ids(cursor.get_array("firstBatch")?);

    let get_more = doc! {"getMore": id, "collection": "many", "batchSize": 5, "$db": "app"};
    let mut request = Message::msg(2, RawDocumentBuf::try_from(&get_more)?);
    if let Op::Msg(m) = &mut request.op {
        m.flags = MsgFlags(MsgFlags::EXHAUST_ALLOWED);
    }
    conn.write_message(&request).await?;
    let (mut answering, mut streamed) = (2, 0);
    loop {
        let reply = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read_message())
            .await??
            .expect("a streamed reply");
        assert_eq!(
            reply.response_to, answering,
            "each reply answers the one before"
        );
        answering = reply.request_id;
        let Op::Msg(msg) = reply.op else {
            anyhow::bail!("not an OP_MSG")
        };
        let body = Document::try_from(msg.body.as_ref())?;
        let cursor = body.get_document("cursor")?;
        seen.extend(ids(cursor.get_array("nextBatch")?));
        if !msg.flags.more_to_come() {
            assert_eq!(cursor.get_i64("id")?, 0, "the last reply closes the cursor");
            break;
        }
        streamed += 1;
    }
    assert!(streamed >= 3, "{streamed} replies were flagged moreToCome");
    assert_eq!(seen, (0..23).collect::<Vec<_>>());

    // The connection is the client's again: a plain command gets its one reply.
    let ping = doc! {"ping": 1, "$db": "admin"};
    conn.write_message(&Message::msg(3, RawDocumentBuf::try_from(&ping)?))
        .await?;
    let reply = conn.read_message().await?.expect("a reply to ping");
    assert_eq!(reply.response_to, 3);
    Ok(())
}

fn ids(batch: &[Bson]) -> Vec<i32> {
    batch
        .iter()
        .filter_map(|d| d.as_document()?.get_i32("_id").ok())
        .collect()
}
