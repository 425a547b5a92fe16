"""`amplint server`: a Language Server (LSP over stdio) that checks the documents an editor has
open with the same engine as `amplint check --stdin-filename`. Like the rest of the linter it
never imports torch."""
