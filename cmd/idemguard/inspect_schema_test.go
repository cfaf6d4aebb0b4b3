package main

import "testing"

// inspect --schema without --postgres is a usage error. (The schema was
// neither checked nor used, and the command went on as if it had not been
// given.)
func TestInspectSchemaWithoutPostgres(t *testing.T) {
	addr, prefix, _ := keysFixture(t)
	code, _, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--schema", `no"such schema`, "s", "i")
	if code != 2 {
		t.Errorf("inspect --schema without --postgres: exit %d, want 2 (usage: --schema needs --postgres); stderr: %s", code, stderr)
	}
}
