//! The Lua scripts that take, rename, renew and count thread leases on Redis's own clock, so
//! that the check and the change are one atomic step whatever the replicas' clocks say.
//!
//! A key's leases are one sorted set: each member is a lease, scored by the Redis time (ms)
//! at which it expires unless renewed. Its spares (threads a replica took ahead for its next
//! submits, see `Cluster::pin`) are a second sorted set of the same kind: they count against
//! the key's threads like leases, but not as threads in use. Every script first drops the
//! expired members, so an abandoned lease costs nothing once its time is up.
//!
//! Every script that takes a lease or renews one first checks the key's generation (a hash
//! `{e, n}`: the fleet's epoch and a counter every such script advances) against what the
//! calling replica last saw: the epoch it knows, and a counter no lower than the last it
//! was told. A Redis that lost its data has no generation; one that came back from an older
//! copy has an older counter, or an epoch a replica has since replaced. Either way the
//! script changes nothing and answers `-1`, and the replica stops trusting Redis's count
//! until the fleet has put its state back.

use std::sync::OnceLock;

/// A script and its SHA1, sent as `EVALSHA` so that a call carries 40 bytes, not the whole
/// body, and Redis looks the script up instead of hashing it again. Redis forgets scripts
/// when it restarts or is told `SCRIPT FLUSH`: `Cluster` then loads [`ALL`] and retries.
pub struct Lua {
    code: &'static str,
    sha: OnceLock<String>,
}

impl Lua {
    const fn new(code: &'static str) -> Lua {
        Lua {
            code,
            sha: OnceLock::new(),
        }
    }

    /// `EVALSHA <sha> <numkeys>`, for the keys and arguments to follow.
    pub fn call(&self, keys: usize) -> redis::Cmd {
        // Room for a submit's call without regrowing: `KEEP` with a full batch of spares
        // asked for is 21 arguments and about 400 bytes.
        let mut cmd = redis::Cmd::with_capacity(24, 512);
        cmd.arg("EVALSHA");
        cmd.arg(self.sha()).arg(keys);
        cmd
    }

    /// `SCRIPT LOAD <body>`.
    pub fn load(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.code);
        cmd
    }

    pub fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| redis::Script::new(self.code).get_hash().to_owned())
    }
}

/// KEYS[1] the key's lease set, KEYS[2] its spare set, KEYS[3] its generation. ARGV:
/// member, limit, ttl ms, epoch, counter floor. Returns `{granted (1), full (0) or stale
/// generation (-1), leases and spares held after, the generation's counter}`.
pub static ACQUIRE: Lua = Lua::new(
    r"
local gen = redis.call('HMGET', KEYS[3], 'e', 'n')
if gen[1] ~= ARGV[4] or tonumber(gen[2] or '-1') < tonumber(ARGV[5]) then
  return {-1, 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
if held >= tonumber(ARGV[2]) then
  return {0, held, tonumber(gen[2])}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 4)
return {1, held + 1, redis.call('HINCRBY', KEYS[3], 'n', 1)}
",
);

/// KEYS[1] the key's lease set, KEYS[2] its spare set, KEYS[3] its generation. ARGV: old
/// member, new member, ttl ms, limit, margin, epoch, counter floor, then the spare members
/// asked for (none or several). On a stale generation nothing changes and `had` is `-1`:
/// the task's lease is put back with the rest of the replica's when the fleet recovers. The lease (or
/// spare, a member named `s:`, in the spare set) a submit took becomes its task's, under a
/// name any replica can release; if the old one had expired it is taken again (the task
/// exists upstream and holds a thread whatever Redis thought). Then as many of the spares
/// asked for are added as leave at least `margin` threads free after them, so that the
/// next submits on this replica need no round trip of their own and every other replica
/// can still take a thread. Returns `{had the old one (0/1), spares granted}`: the first
/// that many of those asked for, and the generation's counter.
pub static KEEP: Lua = Lua::new(
    r"
local gen = redis.call('HMGET', KEYS[3], 'e', 'n')
if gen[1] ~= ARGV[6] or tonumber(gen[2] or '-1') < tonumber(ARGV[7]) then
  return {-1, 0, 0}
end
local n = redis.call('HINCRBY', KEYS[3], 'n', 1)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local from = KEYS[1]
if string.sub(ARGV[1], 1, 2) == 's:' then
  from = KEYS[2]
end
local had = redis.call('ZREM', from, ARGV[1])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 4)
if #ARGV < 8 then
  return {had, 0, n}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
local room = tonumber(ARGV[4]) - tonumber(ARGV[5]) - held
local granted = math.min(room, #ARGV - 7)
if granted <= 0 then
  return {had, 0, n}
end
local scored = {}
for i = 1, granted do
  scored[#scored + 1] = now + ttl
  scored[#scored + 1] = ARGV[7 + i]
end
redis.call('ZADD', KEYS[2], unpack(scored))
redis.call('PEXPIRE', KEYS[2], ttl * 4)
return {had, granted, n}
",
);

/// KEYS[1] the key's lease set, KEYS[2] its released set, KEYS[3] its spare set, KEYS[4]
/// its generation. ARGV: ttl ms, restore (0/1), epoch, counter floor, then members. Without
/// `restore` the generation is checked first: stale, nothing changes and `{-1, {}}` is
/// returned, since a lease missing from a Redis that lost its data has not ended. Pushes each member's expiry forward (a spare's, members
/// named `s:`, in the spare set). A member that is gone (released by the replica that saw
/// its task's final answer, or expired) is returned. With `restore` (Redis came back, or lost
/// its data) a gone lease is added back instead, unless the released set says another
/// replica saw its task end; a gone spare never is, since no thread stands behind it.
/// Returns `{the generation's counter (0 if it is not this epoch's), the members gone for
/// good}`. The members are looked up with one `ZMSCORE` and renewed with one variadic
/// `ZADD` per set, not a command each (Redis 6.2 or later).
pub static RENEW: Lua = Lua::new(
    r"
local gen = redis.call('HMGET', KEYS[4], 'e', 'n')
local current = gen[1] == ARGV[3] and tonumber(gen[2] or '-1') >= tonumber(ARGV[4])
if ARGV[2] ~= '1' and not current then
  return {-1, {}}
end
local n = 0
if current then
  n = redis.call('HINCRBY', KEYS[4], 'n', 1)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local expiry = now + tonumber(ARGV[1])
local restore = ARGV[2] == '1'
local leases, spares = {}, {}
for i = 5, #ARGV do
  local m = ARGV[i]
  if string.sub(m, 1, 2) == 's:' then
    spares[#spares + 1] = m
  else
    leases[#leases + 1] = m
  end
end
local missing = {}
local function renew(set, members, may_restore)
  if #members == 0 then
    return false
  end
  local scores = redis.call('ZMSCORE', set, unpack(members))
  local scored = {}
  for i, m in ipairs(members) do
    if scores[i] or (may_restore and not redis.call('ZSCORE', KEYS[2], m)) then
      scored[#scored + 1] = expiry
      scored[#scored + 1] = m
    else
      missing[#missing + 1] = m
    end
  end
  if #scored > 0 then
    redis.call('ZADD', set, unpack(scored))
  end
  return #scored > 0
end
renew(KEYS[1], leases, restore)
local spares_renewed = renew(KEYS[3], spares, false)
if #ARGV > 4 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 4)
end
if spares_renewed then
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[1]) * 4)
end
return {n, missing}
",
);

/// KEYS[1] the key's lease set, KEYS[2] its released set. ARGV: member, keep ms. A task's
/// final answer: its lease goes, and the released set remembers it for `keep`, so that the
/// replica that created the task does not put it back after an outage.
pub static RELEASE: Lua = Lua::new(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
return 1
",
);

/// KEYS[1] the key's lease set, KEYS[2] its spare set, KEYS[3] its generation. ARGV:
/// epoch, counter floor. Returns `{live leases, live spares, the generation's counter}`,
/// and advances the counter, so that every sync of every replica moves it on and a copy
/// of Redis older than the last sync is told apart; `-1` for a stale generation.
pub static COUNT: Lua = Lua::new(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local counts = {redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), -1}
local gen = redis.call('HMGET', KEYS[3], 'e', 'n')
if gen[1] == ARGV[1] and tonumber(gen[2] or '-1') >= tonumber(ARGV[2]) then
  counts[3] = redis.call('HINCRBY', KEYS[3], 'n', 1)
end
return counts
",
);

/// KEYS[1] a key's generation. ARGV: epoch. Starts the key's generation in this epoch,
/// unless it is in it already (another replica of the fleet started it). Returns its
/// counter.
pub static STAMP: Lua = Lua::new(
    r"
if redis.call('HGET', KEYS[1], 'e') ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'e', ARGV[1], 'n', 0)
end
return tonumber(redis.call('HGET', KEYS[1], 'n'))
",
);

/// KEYS[1] the fleet's epoch. ARGV: the epoch this replica knew (empty: none), a fresh one.
/// The fleet moves to the fresh epoch if the current one is the one this replica knew, or
/// there is none (Redis lost its data, or came back from a copy older than what this
/// replica saw); otherwise another replica moved it already. Returns the epoch now.
pub static EPOCH: Lua = Lua::new(
    r"
local current = redis.call('GET', KEYS[1])
if not current or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return ARGV[2]
end
return current
",
);

/// KEYS[1] the replica set. ARGV: this replica, its timeout ms. Records the heartbeat,
/// forgets replicas silent longer than the timeout, and returns the live ones, sorted, with
/// the Redis time (ms) as the last element.
pub static HEARTBEAT: Lua = Lua::new(
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(live)
live[#live + 1] = tostring(now)
return live
",
);

/// KEYS[1] the refresher lease. ARGV: this replica, ttl ms. Takes the lease if free, or
/// extends it if this replica holds it. Returns 1 if this replica is the refresher.
pub static REFRESHER: Lua = Lua::new(
    r"
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
);

/// KEYS[1] a key's health hash. ARGV: state, reason, until (unix ms, 0: none), replica.
/// Bumps the version, so that every replica can tell a change it has not seen.
pub static HEALTH: Lua = Lua::new(
    r"
local v = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'reason', ARGV[2], 'until', ARGV[3], 'by', ARGV[4])
return v
",
);

/// Every script, for loading them all again after Redis forgot them.
pub static ALL: [&Lua; 10] = [
    &ACQUIRE, &KEEP, &RENEW, &RELEASE, &COUNT, &HEARTBEAT, &REFRESHER, &HEALTH, &STAMP, &EPOCH,
];
