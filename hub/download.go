package hub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// fetch makes snapshots/COMMIT/NAME of f: it downloads the blob unless the cache has it,
// then links the snapshot's path to it.
func (c *Client) fetch(ctx context.Context, ref Ref, commit string, f File) error {
	repoDir := c.Cache.RepoDir(ref.Repo)
	blob := filepath.Join(repoDir, "blobs", f.Blob())
	link := filepath.Join(repoDir, "snapshots", commit, filepath.FromSlash(f.Name))
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	have, err := blobSize(blob)
	if err != nil {
		return err
	}
	if have != f.Size {
		unlock, err := lockBlob(ctx, filepath.Join(c.Cache.Dir, ".locks", RepoFolder(ref.Repo), f.Blob()+".lock"))
		if err != nil {
			return fmt.Errorf("%s: %s: %w", ref, f.Name, err)
		}
		err = c.download(ctx, ref, commit, f, blob)
		unlock()
		if err != nil {
			return err
		}
	} else {
		c.emit(Event{Kind: Cached, File: f.Name, Size: f.Size, Done: f.Size})
	}
	return linkBlob(blob, link)
}

// blobSize is the size of a finished blob, -1 when there is none. A blob whose size is not
// the one the Hub lists is not the file its name says: it is removed and downloaded again.
func blobSize(blob string) (int64, error) {
	st, err := os.Stat(blob)
	if errors.Is(err, os.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// linkBlob points link at blob with a relative symlink, as huggingface_hub does
// (snapshots/COMMIT/NAME -> ../../blobs/BLOB).
func linkBlob(blob, link string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	target, err := filepath.Rel(filepath.Dir(link), blob)
	if err != nil {
		return err
	}
	if old, err := os.Readlink(link); err == nil && old == target {
		return nil
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Symlink(target, link)
}

// newHash returns the hash that names f's blob: sha256 of an LFS file, the git object id of
// a file in git (sha1 over "blob SIZE\x00" and the content).
func newHash(f File) hash.Hash {
	if f.SHA256 != "" {
		return sha256.New()
	}
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", f.Size)
	return h
}

// download fetches f into blob through blob.incomplete, resuming what an earlier pull left
// there, retrying broken transfers, and checks its size and hash before renaming it into
// place. The caller holds the blob's lock.
func (c *Client) download(ctx context.Context, ref Ref, commit string, f File, blob string) error {
	if size, err := blobSize(blob); err != nil || size == f.Size {
		return err // another process finished it while this one waited for the lock
	}
	_ = os.Remove(blob) // a finished blob of the wrong size
	part := blob + ".incomplete"
	out, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	h := newHash(f)
	have, err := io.Copy(h, out) // the bytes an earlier pull got, read into the hash
	if err != nil {
		return fmt.Errorf("%s: %s: %w", ref, part, err)
	}
	if have > f.Size {
		if have, err = restart(out, &h, f); err != nil {
			return err
		}
	}
	c.emit(Event{Kind: Started, File: f.Name, Size: f.Size, Done: have})
	u := c.Endpoint + "/" + ref.Repo + "/resolve/" + commit + "/" + escapePath(f.Name)
	wait := c.RetryWait
	for attempt := 0; have < f.Size; attempt++ {
		if have, err = c.transfer(ctx, u, out, &h, f, have); err == nil {
			continue // transfer ends without an error only with the whole file
		}
		stopped := func() error {
			return fmt.Errorf("%s: %s: stopped at %d of %d bytes, kept for the next pull to resume: %w", ref, f.Name, have, f.Size, ctx.Err())
		}
		if ctx.Err() != nil {
			return stopped()
		}
		if errors.Is(err, errTooLong) {
			out.Close()
			os.Remove(part)
			return fmt.Errorf("%s: %s: removed the download: %w", ref, f.Name, err)
		}
		var herr *HTTPError
		if errors.As(err, &herr) && herr.Status == http.StatusRequestedRangeNotSatisfiable {
			if have, err = restart(out, &h, f); err != nil { // the server has fewer bytes than the part: start over
				return err
			}
		} else if errors.As(err, &herr) && !herr.transient() {
			return c.explain(ref, f.Name, err)
		}
		if attempt >= c.Retries {
			return fmt.Errorf("%s: %s: the download broke at %d of %d bytes (run loom pull again to resume): %w", ref, f.Name, have, f.Size, err)
		}
		c.emit(Event{Kind: Retrying, File: f.Name, Size: f.Size, Done: have, Err: err})
		select {
		case <-ctx.Done():
			return stopped()
		case <-time.After(wait):
		}
		wait *= 2
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.Blob() {
		out.Close()
		os.Remove(part)
		kind := "sha256"
		if f.SHA256 == "" {
			kind = "git object id"
		}
		return fmt.Errorf("%s: %s: the downloaded file's %s is %s, the Hub lists %s: removed the download; run loom pull again, and if it fails the same way the file on the Hub or a proxy between is at fault",
			ref, f.Name, kind, got, f.Blob())
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Rename(part, blob); err != nil {
		return err
	}
	c.emit(Event{Kind: Finished, File: f.Name, Size: f.Size, Done: f.Size})
	return nil
}

// restart empties a partial download and its hash.
func restart(out *os.File, h *hash.Hash, f File) (int64, error) {
	if err := out.Truncate(0); err != nil {
		return 0, err
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	*h = newHash(f)
	return 0, nil
}

// transfer asks for f's bytes from have on (a Range request when have > 0) and appends them
// to out and h. It returns the bytes now on disk. More bytes than f.Size is errTooLong; fewer
// (the body ended early) is an error that keeps them for a resume.
func (c *Client) transfer(ctx context.Context, u string, out *os.File, h *hash.Hash, f File, have int64) (int64, error) {
	header := http.Header{"Accept-Encoding": {"identity"}} // the bytes as stored: a hash and a resume need them
	if have > 0 {
		header.Set("Range", "bytes="+strconv.FormatInt(have, 10)+"-")
	}
	resp, err := c.get(ctx, u, header)
	if err != nil {
		return have, err
	}
	defer resp.Body.Close()
	switch {
	case have > 0 && resp.StatusCode == http.StatusOK: // the server sent the whole file
		c.emit(Event{Kind: Restarted, File: f.Name, Size: f.Size})
		if have, err = restart(out, h, f); err != nil {
			return have, err
		}
	case have > 0 && resp.StatusCode == http.StatusPartialContent:
		if start, ok := rangeStart(resp.Header.Get("Content-Range")); !ok || start != have {
			return have, fmt.Errorf("GET %s: asked for bytes from %d on, got Content-Range %q", u, have, resp.Header.Get("Content-Range"))
		}
	case resp.StatusCode != http.StatusOK:
		return have, fmt.Errorf("GET %s: unexpected %s", u, resp.Status)
	}
	w := &progressWriter{c: c, f: f, done: have}
	n, err := io.Copy(io.MultiWriter(out, *h, w), io.LimitReader(resp.Body, f.Size-have+1))
	have += n
	if have > f.Size {
		return have, fmt.Errorf("GET %s: %w (%d bytes)", u, errTooLong, f.Size)
	}
	if err != nil {
		return have, err
	}
	if have < f.Size {
		return have, fmt.Errorf("GET %s: the answer ended at byte %d of %d: %w", u, have, f.Size, io.ErrUnexpectedEOF)
	}
	return have, nil
}

// errTooLong is a download longer than the size the Hub lists.
var errTooLong = errors.New("the server sent more bytes than the Hub lists for the file")

// rangeStart parses the first byte of "bytes START-END/SIZE".
func rangeStart(cr string) (int64, bool) {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(start, 10, 64)
	return n, err == nil
}

// escapePath escapes each segment of a '/'-separated repository path for a URL.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// progressWriter reports the bytes written through it as Advanced events.
type progressWriter struct {
	c    *Client
	f    File
	done int64
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.done += int64(len(p))
	w.c.emit(Event{Kind: Advanced, File: w.f.Name, Size: w.f.Size, Done: w.done})
	return len(p), nil
}
