"""SWAG multiple choice (four endings): the release's CSV files or the Hub, encoded choices,
accuracy from the logits and a prediction file."""
