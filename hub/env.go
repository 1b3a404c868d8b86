package hub

import (
	"os"
	"path/filepath"
	"strings"
)

// DefaultEndpoint is the Hub's address when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Env is the Hub settings of the environment, read as huggingface_hub reads them.
type Env struct {
	CacheDir string // HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub
	Endpoint string // HF_ENDPOINT without a trailing '/', else DefaultEndpoint
	Token    string // HF_TOKEN, else the token file of huggingface-cli login (HF_TOKEN_PATH, else HF_HOME/token); "" for none
	Offline  bool   // HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is 1, ON, YES or TRUE
}

// FromEnv reads the Hub settings from the process environment.
func FromEnv() Env {
	home, _ := os.UserHomeDir()
	return envFrom(os.Getenv, home)
}

// envFrom is FromEnv with the environment and the home folder given.
func envFrom(getenv func(string) string, home string) Env {
	expand := func(p string) string {
		if p == "~" || strings.HasPrefix(p, "~/") {
			return filepath.Join(home, p[1:])
		}
		return p
	}
	hfHome := expand(getenv("HF_HOME"))
	if hfHome == "" {
		xdg := expand(getenv("XDG_CACHE_HOME"))
		if xdg == "" {
			xdg = filepath.Join(home, ".cache")
		}
		hfHome = filepath.Join(xdg, "huggingface")
	}
	e := Env{Endpoint: strings.TrimRight(getenv("HF_ENDPOINT"), "/")}
	for _, v := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		if e.CacheDir = expand(getenv(v)); e.CacheDir != "" {
			break
		}
	}
	if e.CacheDir == "" {
		e.CacheDir = filepath.Join(hfHome, "hub")
	}
	if e.Endpoint == "" {
		e.Endpoint = DefaultEndpoint
	}
	for _, v := range []string{"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"} {
		switch strings.ToUpper(getenv(v)) {
		case "1", "ON", "YES", "TRUE":
			e.Offline = true
		}
	}
	e.Token = strings.TrimSpace(getenv("HF_TOKEN"))
	if e.Token == "" {
		e.Token = strings.TrimSpace(getenv("HUGGING_FACE_HUB_TOKEN"))
	}
	if e.Token == "" {
		path := expand(getenv("HF_TOKEN_PATH"))
		if path == "" {
			path = filepath.Join(hfHome, "token")
		}
		if data, err := os.ReadFile(path); err == nil {
			e.Token = strings.TrimSpace(string(data))
		}
	}
	return e
}
