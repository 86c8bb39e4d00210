use super::*;

fn stream() -> Stream {
    Box::new(std::io::Cursor::new(Vec::<u8>::new()))
}

#[test]
fn at_the_cap_the_oldest_idle_connection_makes_room_and_busy_ones_are_kept() {
    let c = Connections::new(3);
    let a = c.admit(stream()).expect("under the cap");
    let b = c.admit(stream()).expect("under the cap");
    let busy = c.admit(stream()).expect("under the cap");
    c.set_busy(&busy.conn);
    // a then b became idle again after a request each: b is now the oldest idle.
    c.set_busy(&a.conn);
    c.set_idle(&a.conn);
    let d = c.admit(stream()).expect("b makes room");
    assert_eq!(b.conn.state.load(Ordering::Acquire), CLOSED);
    assert_eq!(a.conn.state.load(Ordering::Acquire), IDLE);
    drop(b);
    assert_eq!(c.open(), 3);
    c.set_busy(&a.conn);
    c.set_busy(&d.conn);
    // Every connection busy: the next one is refused and not counted.
    assert!(c.admit(stream()).is_err());
    assert_eq!(c.open(), 3);
    drop((a, busy, d));
    assert_eq!(c.open(), 0);
    assert!(lock(&c.idle).is_empty(), "nothing left in the idle index");
}

#[tokio::test]
async fn closing_an_idle_connection_ends_its_pending_read() {
    let c = Connections::new(1);
    let (client, server) = tokio::io::duplex(64);
    let mut idle = c.admit(Box::new(server)).expect("under the cap");
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 8];
        idle.read(&mut buf).await.map(|n| (n, idle))
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _newer = c.admit(stream()).expect("the idle one makes room");
    let (n, _idle) = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the read ended")
        .expect("task")
        .expect("read");
    assert_eq!(n, 0, "the closed connection reads as the client's end");
    drop(client);
}
