"""Threads as records (SPEC 7.4, DeerFlow's `/api/threads`): each user's threads, their
titles and metadata, the threads index, and deleting a thread with everything it holds.

Thread ids are per user: `project` of one user and `project` of another are two threads,
as their folders `users/{uid}/threads/{id}` always were, so nothing one user does can
change what another user's ids mean.
"""
