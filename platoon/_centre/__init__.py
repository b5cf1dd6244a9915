"""_centre"""
