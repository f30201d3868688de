package fencelock

import (
	"strings"

	"github.com/fencelock/fencelock/internal/glob"
)

// An aclRule is one rule a Redis user of the lock needs: advice lists it, Check tries it.
type aclRule struct {
	rule  string   // as ACL SETUSER takes it; <KeyPrefix> is Options.KeyPrefix, glob-escaped
	only  string   // "": always needed; else with what (the only* constants)
	needs string   // what fails without it
	sev   Severity // of Check's finding without it
	// try is Check's command for it, {key}, {channel} and {db} a test lock's
	// and the client's; "" when other checks try it. creates: it makes its key.
	try     string
	creates bool
	// redis6 is what Redis 6 needs instead, try6 how Check tries it; "" when the same.
	redis6, try6 string
}

// Conditions of the rules that are not always needed.
const (
	onlyReplicas = "Options.Replicas"
	onlyFsync    = "Options.ReplicaFsync"
	onlyDB       = "a database other than 0" // Options.DB of a go-redis Client or Ring
	onlyCluster  = "a Cluster client"
)

// In this order: SET first, so that later writes fail on its type, not make keys.
var aclRules = []aclRule{
	{rule: "+@scripting", sev: SeverityCritical, needs: "the lock's scripts (EVALSHA, EVAL)"},
	{rule: "~<KeyPrefix>*", sev: SeverityCritical, needs: "the lock's keys"},
	{rule: "&<KeyPrefix>*", sev: SeverityCritical, needs: "the wake-up channels"},
	{rule: "+set", sev: SeverityCritical, needs: "the scripts", try: "SET {key} x PX 1000"},
	{rule: "+get", sev: SeverityCritical, needs: "the scripts", try: "GET {key}"},
	{rule: "+pexpire", sev: SeverityCritical, needs: "the scripts", try: "PEXPIRE {key} 1000"},
	{rule: "+pttl", sev: SeverityCritical, needs: "the scripts", try: "PTTL {key}"},
	{rule: "+incr", sev: SeverityCritical, needs: "the scripts (fences)", try: "INCR {key}", creates: true},
	{rule: "+exists", sev: SeverityCritical, needs: "the scripts", try: "EXISTS {key}"},
	{rule: "+time", sev: SeverityCritical, needs: "the scripts (fences, lines)", try: "TIME"},
	{rule: "+zadd", sev: SeverityCritical, needs: "fair and Redlock lines", try: "ZADD {key} 1 m", creates: true},
	{rule: "+zrange", sev: SeverityCritical, needs: "fair and Redlock lines", try: "ZRANGE {key} 0 0"},
	{rule: "+zrank", sev: SeverityCritical, needs: "Redlock lines", try: "ZRANK {key} m"},
	{rule: "+zrem", sev: SeverityCritical, needs: "fair and Redlock lines", try: "ZREM {key} m"},
	{rule: "+zscore", sev: SeverityCritical, needs: "fair and Redlock lines", try: "ZSCORE {key} m"},
	{rule: "+zcard", sev: SeverityCritical, needs: "semaphores and read-write locks", try: "ZCARD {key}"},
	{rule: "+zcount", sev: SeverityCritical, needs: "RWLock.Inspect", try: "ZCOUNT {key} 0 0"},
	{rule: "+zrangebyscore", sev: SeverityCritical, needs: "RWLock.Inspect", try: "ZRANGEBYSCORE {key} 0 0"},
	{rule: "+zremrangebyscore", sev: SeverityCritical, needs: "read-write locks", try: "ZREMRANGEBYSCORE {key} 0 0"},
	{rule: "+hset", sev: SeverityCritical, needs: "fair and Redlock lines", try: "HSET {key} f v", creates: true},
	{rule: "+hget", sev: SeverityCritical, needs: "fair and Redlock lines", try: "HGET {key} f"},
	{rule: "+hdel", sev: SeverityCritical, needs: "fair and Redlock lines", try: "HDEL {key} f"},
	{rule: "+spublish", sev: SeverityWarning, needs: "releases waking waiters", redis6: "+publish"},
	{rule: "+ssubscribe", sev: SeverityWarning, needs: "waiters woken by releases", redis6: "+subscribe"},
	{rule: "+sunsubscribe", sev: SeverityWarning, needs: "waiters' subscriptions", redis6: "+unsubscribe"},
	{rule: "+pubsub|shardnumsub", sev: SeverityWarning, needs: "Inspect (LockInfo.Waiters)", try: "PUBSUB SHARDNUMSUB {channel}",
		redis6: "+pubsub|numsub", try6: "PUBSUB NUMSUB {channel}"},
	{rule: "+ping", sev: SeverityInfo, needs: "Check (the round trip)"},
	{rule: "+info", sev: SeverityInfo, needs: "Check (the server's settings)"},
	{rule: "+config|get", sev: SeverityInfo, needs: "Check (appendfsync)", try: "CONFIG GET appendfsync"},
	{rule: "+scan", sev: SeverityInfo, needs: "the fencelock command's ls", try: "SCAN 0 MATCH {key} COUNT 1"},
	{rule: "+multi", sev: SeverityInfo, needs: "the fencelock command's release --force"},
	{rule: "+exec", sev: SeverityInfo, needs: "the fencelock command's release --force"},
	{rule: "+del", sev: SeverityCritical, needs: "the scripts", try: "DEL {key}"},
	{rule: "+wait", only: onlyReplicas, sev: SeverityCritical, needs: "acknowledgements by replicas", try: "WAIT 0 0"},
	{rule: "+waitaof", only: onlyFsync, sev: SeverityCritical, needs: "acknowledgements by replicas", try: "WAITAOF 0 0 0"},
	// Without +select every go-redis connection to the database fails.
	{rule: "+select", only: onlyDB, sev: SeverityCritical, needs: "go-redis's connections to the database", try: "SELECT {db}"},
	// What go-redis's ClusterClient sends of its own, tried on every master.
	{rule: "+cluster|slots", only: onlyCluster, sev: SeverityCritical, needs: "go-redis finding the cluster's slots", try: "CLUSTER SLOTS"},
	{rule: "+asking", only: onlyCluster, sev: SeverityCritical,
		needs: "go-redis following ASK while a slot migrates (the lock fails as misconfigured instead of retrying)", try: "ASKING"},
	{rule: "+command", only: onlyCluster, sev: SeverityWarning,
		needs: "go-redis's command info (it logs the refusal at nearly every command, and routes without it)", try: "COMMAND COUNT"},
}

// aclAdvice is the NOPERM advice: every rule, and how to write <KeyPrefix>.
func aclAdvice() string {
	return aclRulesText() + "; <KeyPrefix> is Options.KeyPrefix with a backslash before each * ? [ ] or \\ in it"
}

// aclAdviceFor is the advice for Options.KeyPrefix prefix.
func aclAdviceFor(prefix string) string {
	return strings.ReplaceAll(aclRulesText(), "<KeyPrefix>", glob.Escape(prefix))
}

// aclRulesText lists the rules always needed, then those for Redis 6 and each condition.
func aclRulesText() string {
	var always, redis6, conds []string
	only := map[string][]string{}
	for _, r := range aclRules {
		switch {
		case r.only != "":
			if only[r.only] == nil {
				conds = append(conds, r.only)
			}
			only[r.only] = append(only[r.only], r.rule)
		default:
			always = append(always, r.rule)
		}
		if r.redis6 != "" {
			redis6 = append(redis6, r.redis6+" for "+r.rule)
		}
	}
	var with []string
	for _, c := range conds {
		with = append(with, "with "+c+" "+strings.Join(only[c], " "))
	}
	return "the ACL user needs " + strings.Join(always, " ") +
		" (Redis 6: " + strings.Join(redis6, ", ") + "; " + strings.Join(with, ", ") + ")"
}
