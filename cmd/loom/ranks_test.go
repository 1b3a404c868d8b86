package main

import (
	"maps"
	"strings"
	"testing"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine"
)

func TestProcessEnv(t *testing.T) {
	full := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
	with := func(k, v string) map[string]string {
		m := maps.Clone(full)
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		vars    map[string]string
		multi   bool
		wantErr string
	}{
		{"no world", map[string]string{"RANK": "0"}, false, ""},
		{"one rank", map[string]string{"WORLD_SIZE": "1"}, false, ""},
		{"two ranks", full, true, ""},
		{"no master port", with("MASTER_PORT", ""), false, "MASTER_PORT is not set"},
		{"rank out of range", with("RANK", "2"), false, "RANK=2 out of range"},
		{"bad world size", with("WORLD_SIZE", "two"), false, `WORLD_SIZE="two" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, multi, err := processEnv(func(k string) (string, bool) { v, ok := tc.vars[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || multi != tc.multi {
				t.Fatalf("multi = %v, %v; want %v", multi, err, tc.multi)
			}
			if multi && (env.Rank != 1 || env.WorldSize != 2 || env.LocalRank != 1 || env.Addr() != "127.0.0.1:29500") {
				t.Errorf("env = %+v", env)
			}
		})
	}
}

func TestCheckProcessWorld(t *testing.T) {
	env := dist.ProcessEnv{Rank: 0, WorldSize: 2}
	mesh := func(s string) dist.Mesh {
		m, err := engine.MeshFor(0, s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		mesh    dist.Mesh
		dev     string
		wantErr string
	}{
		{"tp=2 on cuda", mesh("tp=2"), "cuda", ""},
		{"no mesh", dist.Mesh{}, "cuda", "WORLD_SIZE=2 (loom launch --nproc), but --world-size/--mesh give 1 rank(s)"},
		{"larger mesh", mesh("tp=2,dp=2"), "cuda", "give 4 rank(s): pass --world-size 2"},
		{"cpu", mesh("tp=2"), "cpu", "one process per rank runs on CUDA, not --device cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, ok := backend.Lookup(tc.dev)
			if !ok {
				t.Fatalf("backend %s is not registered", tc.dev)
			}
			err := checkProcessWorld(env, tc.mesh, dev)
			if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// Under loom launch (WORLD_SIZE=2), generate on the CPU is refused before anything loads.
func TestGenerateRefusesProcessRanksOnCPU(t *testing.T) {
	for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} {
		t.Setenv(k, v)
	}
	cmd := newRootCmd()
	cmd.SetArgs([]string{"generate", "--model", "../../testdata/tiny-llama", "--prompt-ids", "1,2", "--device", "cpu", "--world-size", "2"})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "one process per rank runs on CUDA, not --device cpu") {
		t.Fatalf("error = %v", err)
	}
}
