package main

import (
	"strings"
	"testing"
)

func TestURL_RedactsSecretsWhereverPrinted(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"redis://u:pw@h:1/0?dial_timeout=1s":                        "redis://u:xxxxx@h:1/0?dial_timeout=1s",
		"redis+sentinel://h:1/m?sentinel_password=sp&Token=t":       "redis+sentinel://h:1/m?sentinel_password=xxxxx&Token=xxxxx",
		"redis://u:pw@h:notaport":                                   "redis://xxxxx@h:notaport",
		"redis://u:p/w@h:1":                                         "redis://xxxxx@h:1",
		"redis:u:pw@h":                                              "redis:xxxxx@h",
		"::bad?api_key=k":                                           "::bad?api_key=xxxxx",
		"file:///x":                                                 "file:///x",
		"zk://alice:pw@a:1,b:2/app?session_timeout=5s":              "zk://alice:xxxxx@a:1,b:2/app?session_timeout=5s",
		"zk://alice:p/w@a:1/app":                                    "zk://xxxxx@a:1/app",
		"postgres://app:s3cret@h:5432/db?table=t&sslmode=disable":   "postgres://app:xxxxx@h:5432/db?table=t&sslmode=disable",
		"postgresql://h/db?user=app&password=s3cret":                "postgresql://h/db?user=app&password=xxxxx",
		"rediss://:pw@h:1?cert=c.pem&key=k.pem&ca=ca.pem":           "rediss://:xxxxx@h:1?cert=c.pem&key=k.pem&ca=ca.pem",
		"redis+cluster://u:pw@a:1,b:2?api_key=k1&Key=k2":            "redis+cluster://u:xxxxx@a:1,b:2?api_key=xxxxx&Key=xxxxx",
		"redis://h:1/0?pw=hunter2&dial_timeout=1s":                  "redis://h:1/0?pw=xxxxx&dial_timeout=1s",
		"redis+sentinel://h:1/m?sentinel_pw=sp&sentinel_username=u": "redis+sentinel://h:1/m?sentinel_pw=xxxxx&sentinel_username=u",
		"postgres://h/db?sslmode=disable&pasword=s3cret":            "postgres://h/db?sslmode=disable&pasword=xxxxx",
		"::bad?pw=k": "::bad?pw=xxxxx",
	}
	for raw, want := range cases {
		if got := redact(raw); got != want {
			t.Errorf("redact(%q) = %q, want %q", raw, got, want)
		}
	}
	if got := scrub("a hunter2 b hunter2", []string{"hunter2"}); got != "a xxxxx b xxxxx" {
		t.Errorf("scrub: %q", got)
	}
	// Replacing can make a new occurrence ("a" + "xxxxx"): scrub repeats.
	if got := scrub("aaxxb", []string{"axx"}); strings.Contains(got, "axx") {
		t.Errorf("scrub left a secret: %q", got)
	}
}

// Symptom: ?statement_timeout= values were scrubbed from messages, mangling an address holding the same digits, and DLOCK_URL was withheld from CMD.
// PostgreSQL run-time settings in a postgres:// URL (?lock_timeout=,
// ?statement_timeout=) are not secrets. A credential-like name stays
// secret.
func TestURL_PostgresRuntimeSettingsArePlain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, want string
		secret    bool
	}{
		{"postgres://127.0.0.127:5432/db?lock_timeout=127&statement_timeout=5s&keepalives_idle=30",
			"postgres://127.0.0.127:5432/db?lock_timeout=127&statement_timeout=5s&keepalives_idle=30", false},
		{"postgres://h/db?idle_in_transaction_session_timeout=10s&pw=Sekr1t",
			"postgres://h/db?idle_in_transaction_session_timeout=10s&pw=" + redactedMark, true},
		{"postgres://h/db?auth_timeout=Sekr1t", "postgres://h/db?auth_timeout=" + redactedMark, true},
		{"postgres://h/db?mystery=Sekr1t", "postgres://h/db?mystery=" + redactedMark, true},
	} {
		if got := redact(tc.raw); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.raw, got, tc.want)
		}
		if got := hasSecret(tc.raw); got != tc.secret {
			t.Errorf("hasSecret(%q) = %v, want %v", tc.raw, got, tc.secret)
		}
	}
}
