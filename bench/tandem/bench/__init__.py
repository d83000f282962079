"""`tandem bench`: workloads, load generation and reports for OpenAI endpoints and Tandem pools."""
