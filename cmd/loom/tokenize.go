package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/tokenizer"
)

func newTokenizeCmd() *cobra.Command {
	var (
		dir         string
		text        string
		messages    string
		addGen      bool
		render      bool
		noSpecial   bool
		textFlagSet bool
	)
	cmd := &cobra.Command{
		Use:   "tokenize",
		Short: "Print the token ids of a text, or of chat messages through the chat template",
		Long: `With --text, prints the token ids of the text as a JSON list, with the special tokens that the
tokenizer's post-processor adds (as transformers' encode does by default).

With --messages FILE (a JSON list of {"role": ..., "content": ...} objects; "-" reads stdin),
renders the model's chat template and prints the token ids of the result, encoded without adding
special tokens again (the template writes them), as apply_chat_template(tokenize=True) does; with
--render it prints the rendered text instead.

Only the tokenizer files are read: tokenizer.json, tokenizer_config.json and the chat template.`,
		Example: `  loom tokenize --model testdata/tiny-llama --text "Hello world"
  loom tokenize --model testdata/tiny-qwen2 --messages chat.json --render`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveModels(&dir); err != nil {
				return err
			}
			textFlagSet = cmd.Flags().Changed("text")
			if textFlagSet == (messages != "") {
				return errors.New("give either --text or --messages")
			}
			if render && textFlagSet {
				return errors.New("--render goes with --messages")
			}
			out := cmd.OutOrStdout()
			var tok *tokenizer.Tokenizer
			if !render {
				var err error
				if tok, err = tokenizer.LoadDir(dir); err != nil {
					return err
				}
			}
			if textFlagSet {
				ids, err := tok.Encode(text, !noSpecial)
				if err != nil {
					return err
				}
				return printIDs(out, ids)
			}
			msgs, err := readMessages(cmd.InOrStdin(), messages)
			if err != nil {
				return err
			}
			tmpl, err := chattemplate.Load(dir)
			if err != nil {
				return err
			}
			prompt, err := tmpl.Render(msgs, addGen)
			if err != nil {
				return err
			}
			if render {
				_, err := io.WriteString(out, prompt)
				return err
			}
			ids, err := tok.Encode(prompt, false)
			if err != nil {
				return err
			}
			return printIDs(out, ids)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "model", "", modelUsage+" (only its tokenizer files are read)")
	f.StringVar(&text, "text", "", "text to tokenize")
	f.StringVar(&messages, "messages", "", `JSON file with a list of {"role", "content"} messages ("-": stdin)`)
	f.BoolVar(&addGen, "add-generation-prompt", true, "with --messages: end with the start of an assistant turn")
	f.BoolVar(&render, "render", false, "with --messages: print the rendered chat template instead of ids")
	f.BoolVar(&noSpecial, "no-special-tokens", false, "with --text: do not add the post-processor's special tokens")
	_ = cmd.MarkFlagRequired("model")
	return cmd
}

// printIDs writes ids as one JSON list.
func printIDs(w io.Writer, ids []int) error {
	if ids == nil {
		ids = []int{}
	}
	data, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

// readMessages reads a JSON list of chat messages from path ("-": stdin). A string content
// is the message's text; other keys (and content that is not a string) go to the template
// as they are.
func readMessages(stdin io.Reader, path string) ([]chattemplate.Message, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("--messages: %w", err)
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("--messages %s: want a JSON list of {\"role\", \"content\"} objects: %w", path, err)
	}
	msgs := make([]chattemplate.Message, len(raw))
	for i, m := range raw {
		if err := json.Unmarshal(m["role"], &msgs[i].Role); err != nil || msgs[i].Role == "" {
			return nil, fmt.Errorf("--messages %s: message %d has no role", path, i)
		}
		for k, v := range m {
			switch k {
			case "role":
			case "content":
				if json.Unmarshal(v, &msgs[i].Content) == nil {
					continue
				}
				fallthrough
			default:
				if msgs[i].Fields == nil {
					msgs[i].Fields = map[string]any{}
				}
				msgs[i].Fields[k] = v
			}
		}
	}
	return msgs, nil
}
