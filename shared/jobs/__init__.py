"""Bulk jobs, as every role and command meets them: how work is held and output kept (settings), a job's state
in the job bucket (record and progress), its claim, its streams and consumers, publishing its batches, holding
work taken from the work queue, its results read back, its documents read from files, and the writer that puts
its vectors into a sink."""
