"""Quality harness pieces: the code corpus, its tokenizer and the retrieval tasks."""
