//! A `redis-server` of a test's own, on a unix socket in a temp dir (no TCP port at all),
//! for the cluster tests. Without `redis-server` a test says so and passes, so that
//! `cargo test` works on a fresh machine; `.ci/run` installs it and runs the suite with
//! `CI=true`, which (as `KEYRELAY_REQUIRE_REDIS=1` does) turns its absence into a failure.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` of the test's own, on a unix socket in a temp dir.
pub struct Redis {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Redis {
    /// `None` (with a note) when `redis-server` is not installed and not required.
    pub fn start() -> Option<Redis> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            let required = std::env::var_os("KEYRELAY_REQUIRE_REDIS").is_some()
                || std::env::var("CI").is_ok_and(|ci| ci == "true");
            assert!(
                !required,
                "redis-server is required here (CI) but not installed"
            );
            eprintln!("redis-server is not installed: skipping (apt-get install redis-server)");
            return None;
        }
        let mut redis = Redis {
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        redis.launch();
        Some(redis)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    /// Starts (or restarts) the server with an append-only file, so a restart keeps data.
    pub fn launch(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.socket())
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).expect("redis url");
        for _ in 0..500 {
            if let Ok(mut conn) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not come up");
    }

    /// Kills the server and starts it again with no data, as a failover to an empty replica
    /// or a restart without persistence would.
    pub fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(self.dir.path().join("appendonlydir"));
        self.launch();
    }

    /// A copy of the server's data as it is now, to come back to with [`Redis::restore`].
    pub fn snapshot(&self) -> tempfile::TempDir {
        redis::cmd("BGREWRITEAOF")
            .query::<()>(&mut self.conn())
            .expect("BGREWRITEAOF");
        for _ in 0..500 {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query(&mut self.conn())
                .expect("INFO");
            if info.contains("aof_rewrite_in_progress:0")
                && !info.contains("aof_rewrite_scheduled:1")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let copy = tempfile::tempdir().expect("temp dir");
        copy_dir(&self.dir.path().join("appendonlydir"), copy.path());
        copy
    }

    /// Kills the server and starts it again from `snapshot`: a failover to a replica that
    /// lagged, or a restore from an older backup.
    pub fn restore(&mut self, snapshot: &tempfile::TempDir) {
        self.kill();
        let dir = self.dir.path().join("appendonlydir");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("appendonlydir");
        copy_dir(snapshot.path(), &dir);
        self.launch();
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_connection()
            .expect("redis connection")
    }

    /// Every lease member of a key's set (expired ones included).
    pub fn leases(&self, key: &str) -> Vec<String> {
        self.members(&format!("keyrelay:key:{{{key}}}:leases"))
    }

    /// Every spare of a key (expired ones included).
    pub fn spares(&self, key: &str) -> Vec<String> {
        self.members(&format!("keyrelay:key:{{{key}}}:spares"))
    }

    pub fn members(&self, set: &str) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(set)
            .arg(0)
            .arg(-1)
            .query(&mut self.conn())
            .expect("ZRANGE")
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
