"""Contrastive losses and training loops shared by the methods."""
