package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Cache is a Hugging Face hub cache folder (Env.CacheDir).
type Cache struct {
	Dir string
}

// RepoDir is the folder of a repository in the cache (it may not exist).
func (c Cache) RepoDir(repo string) string { return filepath.Join(c.Dir, RepoFolder(repo)) }

// NotCachedError says that a model is not in the cache, and why.
type NotCachedError struct {
	Ref    Ref
	Cache  string // the cache folder
	Reason string
}

func (e *NotCachedError) Error() string {
	return fmt.Sprintf("%s is not in the Hugging Face cache %s: %s", e.Ref, e.Cache, e.Reason)
}

// Resolve returns the snapshot folder of ref in the cache: snapshots/REV when the revision is
// a commit hash, else snapshots/<the commit in refs/REV>. It reads only the cache; a model
// that is not there is a *NotCachedError.
func (c Cache) Resolve(ref Ref) (string, error) {
	repoDir := c.RepoDir(ref.Repo)
	notCached := func(format string, args ...any) error {
		return &NotCachedError{Ref: ref, Cache: c.Dir, Reason: fmt.Sprintf(format, args...)}
	}
	if st, err := os.Stat(repoDir); err != nil || !st.IsDir() {
		return "", notCached("no folder %s", RepoFolder(ref.Repo))
	}
	commit := ref.Revision
	if !IsCommit(commit) {
		var err error
		if commit, err = c.readRef(ref); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				have := c.refs(ref.Repo)
				if len(have) == 0 {
					return "", notCached("no refs/%s", ref.Revision)
				}
				return "", notCached("no refs/%s (cached revisions: %s)", ref.Revision, strings.Join(have, ", "))
			}
			return "", err
		}
	}
	snap := filepath.Join(repoDir, "snapshots", commit)
	if st, err := os.Stat(snap); err != nil || !st.IsDir() {
		if commit == ref.Revision {
			return "", notCached("no snapshot of commit %s", commit)
		}
		return "", notCached("refs/%s names commit %s, which has no snapshot", ref.Revision, commit)
	}
	return snap, nil
}

// readRef returns the commit that refs/REV of ref's repository names.
func (c Cache) readRef(ref Ref) (string, error) {
	path := filepath.Join(c.RepoDir(ref.Repo), "refs", filepath.FromSlash(ref.Revision))
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	commit := strings.TrimSpace(string(data))
	if !IsCommit(commit) {
		return "", fmt.Errorf("hub cache: %s holds %q, not a commit hash", path, commit)
	}
	return commit, nil
}

// writeRef records that revision rev of repo is commit, atomically (a temporary file renamed
// over the old one), as huggingface_hub does; nothing when rev is that commit.
func (c Cache) writeRef(repo, rev, commit string) error {
	if rev == commit {
		return nil
	}
	path := filepath.Join(c.RepoDir(repo), "refs", filepath.FromSlash(rev))
	if data, err := os.ReadFile(path); err == nil && string(data) == commit {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ref-*.tmp")
	if err != nil {
		return err
	}
	_, err = tmp.WriteString(commit)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// refMap maps the refs of repo: revision (slash-separated, e.g. refs/pr/1) to commit.
func (c Cache) refMap(repo string) map[string]string {
	root := filepath.Join(c.RepoDir(repo), "refs")
	out := map[string]string{}
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(d.Name(), ".tmp") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return nil
		}
		rev := filepath.ToSlash(rel)
		if commit, err := c.readRef(Ref{Repo: repo, Revision: rev}); err == nil {
			out[rev] = commit
		}
		return nil
	})
	return out
}

// refs lists the revisions cached for repo, sorted.
func (c Cache) refs(repo string) []string {
	m := c.refMap(repo)
	revs := make([]string, 0, len(m))
	for rev := range m {
		revs = append(revs, rev)
	}
	slices.Sort(revs)
	return revs
}

// CachedModel is one snapshot of a model in the cache.
type CachedModel struct {
	Repo       string   // ORG/NAME
	Commit     string   // the snapshot's commit
	Revisions  []string // the cached refs that name Commit (main, a tag...), sorted; none for a commit downloaded by hash
	Dir        string   // the snapshot folder
	Files      int      // files in the snapshot
	Size       int64    // their bytes
	Missing    int      // links whose blob is gone
	Unfinished bool     // the repository has downloads that did not finish (blobs/*.incomplete)
}

// List returns the model snapshots in the cache, by repository, then with the snapshots that
// refs name first (main first of all), then by commit. A cache folder that does not exist
// holds no models.
func (c Cache) List() ([]CachedModel, error) {
	entries, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []CachedModel
	for _, e := range entries {
		repo, ok := repoFromFolder(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		repoDir := filepath.Join(c.Dir, e.Name())
		byCommit := map[string][]string{}
		for rev, commit := range c.refMap(repo) {
			byCommit[commit] = append(byCommit[commit], rev)
		}
		unfinished := false
		if blobs, err := os.ReadDir(filepath.Join(repoDir, "blobs")); err == nil {
			unfinished = slices.ContainsFunc(blobs, func(b fs.DirEntry) bool { return strings.HasSuffix(b.Name(), ".incomplete") })
		}
		snaps, err := os.ReadDir(filepath.Join(repoDir, "snapshots"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		var models []CachedModel
		for _, s := range snaps {
			if !s.IsDir() {
				continue
			}
			m := CachedModel{Repo: repo, Commit: s.Name(), Revisions: byCommit[s.Name()],
				Dir: filepath.Join(repoDir, "snapshots", s.Name()), Unfinished: unfinished}
			slices.Sort(m.Revisions)
			if err := m.measure(); err != nil {
				return nil, err
			}
			models = append(models, m)
		}
		slices.SortFunc(models, func(a, b CachedModel) int {
			if r := rank(a) - rank(b); r != 0 {
				return r
			}
			return strings.Compare(a.Commit, b.Commit)
		})
		out = append(out, models...)
	}
	slices.SortStableFunc(out, func(a, b CachedModel) int { return strings.Compare(a.Repo, b.Repo) })
	return out, nil
}

// rank orders snapshots: main's first, then those other refs name, then the rest.
func rank(m CachedModel) int {
	switch {
	case slices.Contains(m.Revisions, DefaultRevision):
		return 0
	case len(m.Revisions) > 0:
		return 1
	}
	return 2
}

// measure counts the files of the snapshot and their bytes (following the links).
func (m *CachedModel) measure() error {
	return filepath.WalkDir(m.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		st, err := os.Stat(path)
		if err != nil {
			m.Missing++
			return nil
		}
		m.Files++
		m.Size += st.Size()
		return nil
	})
}
