// Package hub is Loom's side of the Hugging Face Hub: it finds models in the local cache that
// huggingface_hub fills (huggingface-cli download, transformers' from_pretrained) and downloads
// them from the Hub into that same cache.
//
// The cache is the folder HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
// else ~/.cache/huggingface/hub (FromEnv). It holds a folder per repository:
//
//	models--ORG--NAME/
//	  blobs/<sha256>                  an LFS file's content (the weights), named by its sha256
//	  blobs/<git blob id>             a file kept in git (config.json...), named by its git object id
//	  refs/<revision>                 the commit a branch or tag named when it was downloaded
//	  snapshots/<commit>/<file>       relative symlinks into blobs/, a folder per commit
//
// A model is named ORG/NAME[@REVISION] (Ref); Cache.Resolve turns a name into its snapshot
// folder without touching the network, and Client.Pull downloads the files Loom reads (Select)
// through the Hub API: GET /api/models/ORG/NAME/revision/REV?blobs=true for the commit and
// each file's size and hash, then GET /ORG/NAME/resolve/COMMIT/FILE for each file, into
// blobs/<name>.incomplete (resumed with a Range request after a broken transfer), checked
// against the size and the hash (sha256 for LFS files, the git blob id for the others) before
// it takes its place. HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE mean what they mean to
// huggingface_hub.
package hub
